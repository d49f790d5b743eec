"""Hybrid stacks, torch: each block is its member's own block (built by the member's family at scope block, one
layer), the blocks stacked and wrapped by the hybrid's front (embedding, positions) and final norm. Decoding needs
nothing of its own: every member's block decodes, and a ``Stack`` decodes block by block, so the state is the
members' states and KV caches in order. The torch-free half is ``attnbench.families.hybrid.spec``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import NetworkFamily, Stack, front, network
from attnbench.families.catalogue import HYBRID, spec_of
from attnbench.families.registry import build_model, call_context, row_extras, torch_family
from attnbench.families.torch_family import package_problem, rng_untouched, with_weights_of


class HybridTorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        made = front(case, device, dtype)  # before any block, as every family makes it
        blocks = [build_model(member, device, dtype) for member in HYBRID.members(case)]
        return network(case, Stack(*blocks), made, device, dtype)

    def tiny(self, case: Case) -> Case:
        """One cycle of the pattern, so that the probe runs every member's kernel."""
        assert case.hybrid is not None
        return replace(super().tiny(case), layers=len(case.hybrid.pattern))

    def reference(self, case: Case, model: nn.Module, device: str) -> nn.Module | None:
        """The same stack with every member in its own family's reference form (the recurrent form, the explicit
        attention), eager, in float64, holding ``model``'s weights."""
        with rng_untouched(device):
            made = front(case, device, torch.float64)
            members = [torch_family(m).reference_case(m) for m in HYBRID.members(case)]
            blocks = [torch_family(m).build(m, device, torch.float64) for m in members]
            twin = network(case, Stack(*blocks), made, device, torch.float64)
        return with_weights_of(twin, model)

    def unavailable(self, case: Case, device_type: str) -> str | None:
        for member in HYBRID.distinct(case):
            spec = spec_of(member)
            if device_type not in spec.devices:
                return f"{case.model}'s member {member.model} needs {' or '.join(d.upper() for d in spec.devices)}"
            if spec.package is not None:
                problem = package_problem(member.model, spec.package)
                if problem is not None:
                    return f"{case.model}'s member {problem}"
            reason = torch_family(member).unavailable(member, device_type)
            if reason is not None:
                return f"{case.model}'s member {member.model}: {reason}"
        return None

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        extra: dict[str, ExtraValue] = {}
        for member in HYBRID.distinct(case):
            for key, value in row_extras(member, device).items():
                extra.setdefault(key, value)
        return extra

    def compiled(self, case: Case) -> bool:
        return any(torch_family(m).compiled(m) for m in HYBRID.distinct(case))

    def call_context(self, case: Case, model: nn.Module) -> contextlib.AbstractContextManager[object]:
        """Every member family's context around the whole stack (a forced SDPA backend pins for all of it)."""
        return _all_of([call_context(member, model) for member in HYBRID.distinct(case)])


@contextlib.contextmanager
def _all_of(contexts: list[contextlib.AbstractContextManager[object]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


TORCH = HybridTorch()
