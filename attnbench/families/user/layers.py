"""The torch half of models the user brings (``attnbench.families.user.spec``): import the factory, call it with a
``ModelRequest``, and check what comes back before anything is timed.

A factory that cannot be imported or raises, or a module on the wrong device or mostly in another dtype (a few
parameters or buffers in float32 are a bf16 model's own business), or one that changes the
shape of its input, is an ``error`` row naming the model, its factory and what was wrong; a module without the
decode protocol asked to decode, or without the protocol a serving question needs (``Verifiable``, ``Packable``), is
an ``unsupported`` row. None of it stops the sweep: every other row is kept.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import STATEFUL_MODES, Case
from attnbench.families.plugins import ModelRequest, Packable, Referenced, Verifiable
from attnbench.families.states import Decodable
from attnbench.families.torch_family import (
    CHECK_BATCH,
    CHECK_SEQ_LEN,
    TorchFamily,
    Unsupported,
    one_line,
    torch_dtype,
)
from attnbench.families.user.spec import user_of


class UserModelError(Exception):
    """A model the user brought failed to build or did something it must not: the row's reason says which."""


def load_factory(path: str) -> Any:
    """The callable ``module.path:function`` names, imported (this runs the user's module)."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{path} is {type(target).__name__}, not a function")
    return target


def request(case: Case, device: str, dtype: torch.dtype) -> ModelRequest:
    """What the factory is called with for ``case``."""
    return ModelRequest(
        name=case.model,
        mode=case.mode,
        device=device,
        dtype=case.dtype,
        torch_dtype=dtype,
        batch=case.batch,
        seq_len=case.seq_len,
        d_model=case.d_model,
        heads=case.heads or 1,
        layers=case.layers,
        causal=case.causal,
        options=dict(case.options),
        packing=case.packing,
    )


def _where(case: Case) -> str:
    return f"{case.model} (factory {user_of(case).factory if case.definition else '?'})"


class UserTorch(TorchFamily):
    # The model is the user's: a copy at another size may not even exist (a fixed length), so the case's own
    # build and first call are its probe, and that call is checked before anything is timed.
    trusted = False

    def probes(self, case: Case) -> bool:
        return False

    def exited(self, case: Case, exc: SystemExit) -> str | None:
        """The reason of the row whose model (its import, factory or a call) raised ``SystemExit``: in-process it
        would end the sweep with the model's exit code. ``os._exit`` cannot be caught this way; ``isolate: true``
        turns it into a ``crashed`` row."""
        return f"{_where(case)} called sys.exit({one_line(repr(exc.code), 80)}): a model must not end the process"

    def check_output(self, case: Case, output: object, expected: tuple[int, ...], device: torch.device) -> None:
        """UserModelError unless one call's ``output`` is a tensor of the input's shape, in the case's dtype and on
        ``device``: a float64 result, or a meta tensor that did no work, would otherwise be timed as the case."""
        where = _where(case)
        if not isinstance(output, torch.Tensor):
            raise UserModelError(f"{where} returned {type(output).__name__} from a call, not a tensor")
        if tuple(output.shape) != expected:
            raise UserModelError(
                f"{where} maps {expected} to {tuple(output.shape)}: a model must keep (batch, seq_len, d_model)"
            )
        dtype = torch_dtype(case.dtype)
        if output.dtype != dtype:
            raise UserModelError(f"{where} returned {output.dtype}, not {dtype} (the case's dtype {case.dtype})")
        held = output.device
        if held.type != device.type or (device.index is not None and held.index not in (None, device.index)):
            raise UserModelError(f"{where} returned a tensor on {held}, not on {device}")

    def disagrees(self, case: Case, message: str) -> Exception:
        return UserModelError(f"{_where(case)}: {message}")

    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        user = user_of(case)  # the catalogue sends only user cases here
        where = f"{case.model} (factory {user.factory})"
        try:
            factory = load_factory(user.factory)
        except Exception as exc:  # the user's import: whatever it raises is the row's reason
            raise UserModelError(f"{where} does not import: {type(exc).__name__}: {one_line(str(exc))}") from exc
        try:
            module = factory(request(case, device, dtype))
        except torch.cuda.OutOfMemoryError:
            raise  # the executor records it as oom
        except Exception as exc:
            raise UserModelError(f"{where} raised {type(exc).__name__}: {one_line(str(exc))}") from exc
        if not isinstance(module, nn.Module):
            raise UserModelError(f"{where} returned {type(module).__name__}, not a torch.nn.Module")
        wanted = torch.device(device)
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            held = tensor.device
            if held.type != wanted.type or (wanted.index is not None and held.index not in (None, wanted.index)):
                raise UserModelError(f"{where}: {name} is on {held}, not on {device}")
        problem = dtype_problem(module, dtype)
        if problem is not None:
            raise UserModelError(f"{where}: {problem} (the case's dtype {case.dtype})")
        if case.mode in STATEFUL_MODES and not isinstance(module, Decodable):
            raise Unsupported(
                f"{case.model}: {type(module).__name__} has no decode protocol (init_state, prefill and step; "
                f"see attnbench.plugin), so mode {case.mode} cannot carry its state"
            )
        if case.mode == "verify" and not isinstance(module, Verifiable):
            raise Unsupported(
                f"{case.model}: {type(module).__name__} is not Verifiable (verify and rollback; see "
                "attnbench.plugin), so it cannot check draft tokens and roll back to the accepted ones"
            )
        if case.packing and not isinstance(module, Packable):
            raise Unsupported(
                f"{case.model}: {type(module).__name__} is not Packable (packed; see attnbench.plugin), so it "
                "cannot run sequences packed end to end"
            )
        return module

    def check_case(self, case: Case) -> Case:
        """The factory's model as asked (its layers kept: there is no probe's copy of it) at the check's batch and
        length."""
        return replace(case, batch=min(case.batch, CHECK_BATCH), seq_len=min(case.seq_len, CHECK_SEQ_LEN))

    def reference(self, case: Case, model: nn.Module, device: str) -> nn.Module | None:
        """The module's own ``reference`` method (``attnbench.plugin.Referenced``) on a float64 copy of it, or None
        where it has none (the row's check says ``unchecked``)."""
        if not isinstance(model, Referenced):
            return None
        twin: Any = copy.deepcopy(model).to(torch.float64)  # still the user's class: Referenced
        return UserReference(twin)


class UserReference(nn.Module):
    """A user's module whose call is its ``reference`` method: what the check holds its forward to."""

    def __init__(self, model: Referenced) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.reference(x)


# At least this share of a model's floating-point parameter elements must be in the case's dtype: a bf16 model keeps
# some parameters in float32 on purpose (mamba_ssm's Mamba2 its A_log and D, for the scan's precision), and buffers
# such as RoPE's inv_freq are not its weights at all.
BULK_SHARE = 0.5


def dtype_problem(module: nn.Module, dtype: torch.dtype) -> str | None:
    """Why ``module`` is not a model in ``dtype`` (its floating-point parameters mostly in another), or None."""
    floating = [(name, p) for name, p in module.named_parameters() if p.is_floating_point()]
    total = sum(p.numel() for _, p in floating)
    held = sum(p.numel() for _, p in floating if p.dtype == dtype)
    if not total or held >= BULK_SHARE * total:
        return None
    name, largest = max(((n, p) for n, p in floating if p.dtype != dtype), key=lambda item: item[1].numel())
    return (
        f"{held / total:.0%} of its floating-point parameter elements are {dtype}, where at least "
        f"{BULK_SHARE:.0%} must be; the largest other is {name}, {largest.dtype}"
    )


TORCH = UserTorch()
