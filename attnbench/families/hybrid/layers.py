"""Hybrid stacks, torch: each block is its member's own block (built by the member's family at scope block, one
layer), the blocks stacked and wrapped by the hybrid's front (embedding, positions) and final norm. Decoding needs
nothing of its own: every member's block decodes, and a ``Stack`` decodes block by block, so the state is the
members' states and KV caches in order. The torch-free half is ``attnbench.families.hybrid.spec``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import NetworkFamily, Stack, TransformerBlock, front, network
from attnbench.families.catalogue import HYBRID, spec_of
from attnbench.families.hybrid.spec import stack_of
from attnbench.families.registry import build_model, call_context, launch_limit, row_extras, torch_family
from attnbench.families.states import StackState, decodable, packed, rollback, verify
from attnbench.families.torch_family import LaunchLimit, package_problem, rng_untouched, with_weights_of


class SideBySide(nn.Module):
    """Members run on the same input, their outputs summed (a parallel hybrid's mixer: Falcon-H1's attention and
    Mamba-2). It decodes as its members do, each with its own state: (B, T, d) -> (B, T, d)."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([member(x) for member in self.members]).sum(0)

    def init_state(self, batch: int, capacity: int) -> StackState:
        return StackState([decodable(member).init_state(batch, capacity) for member in self.members])

    def prefill(self, x: torch.Tensor, state: StackState, *, output: bool = True) -> torch.Tensor | None:
        outs = [decodable(m).prefill(x, s, output=output) for m, s in zip(self.members, state.layers, strict=True)]
        return None if not output else torch.stack([o for o in outs if o is not None]).sum(0)

    def step(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        steps = [decodable(m).step(x, s) for m, s in zip(self.members, state.layers, strict=True)]
        return torch.stack(steps).sum(0)

    def verify(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        return torch.stack([verify(m, x, s) for m, s in zip(self.members, state.layers, strict=True)]).sum(0)

    def rollback(self, state: StackState, accepted: int) -> None:
        for member, held in zip(self.members, state.layers, strict=True):
            rollback(member, held, accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        return torch.stack([packed(member, x, lengths) for member in self.members]).sum(0)


class HybridTorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        return self._stack(case, device, dtype, lambda member: member)

    def _stack(self, case: Case, device: str, dtype: torch.dtype, form: Callable[[Case], Case]) -> nn.Module:
        """The stack, each member built as ``form`` says (itself, or its family's reference form)."""
        made = front(case, device, dtype)  # before any block, as every family makes it
        ffn_mult = int(HYBRID.option(case, "ffn_mult"))
        blocks: list[nn.Module] = []
        for i in range(case.layers):
            members = [form(member) for member in HYBRID.block(case, i)]
            if len(members) == 1:
                blocks.append(build_model(members[0], device, dtype))
            else:  # one pre-norm block around the members side by side, with its FFN
                mixer = SideBySide([build_model(member, device, dtype) for member in members])
                blocks.append(TransformerBlock(mixer, case.d_model, ffn_mult, device=device, dtype=dtype))
        return network(case, Stack(*blocks), made, device, dtype)

    def tiny(self, case: Case) -> Case:
        """One cycle of the pattern, so that the probe runs every member's kernel."""
        return replace(super().tiny(case), layers=len(stack_of(case).pattern))

    def reference(self, case: Case, model: nn.Module, device: str) -> nn.Module | None:
        """The same stack with every member in its own family's reference form (the recurrent form, the explicit
        attention), eager, in float64, holding ``model``'s weights."""
        with rng_untouched(device):
            twin = self._stack(case, device, torch.float64, lambda member: torch_family(member).reference_case(member))
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

    def launch_limit(self, case: Case, device_type: str) -> LaunchLimit | None:
        """The tightest of its members' caps: every block runs at the stack's batch."""
        limits = [limit for m in HYBRID.distinct(case) if (limit := launch_limit(m, device_type)) is not None]
        return min(limits, key=lambda limit: limit.batch, default=None)

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
