"""Every family's torch half, found by name, and the probe that says whether a case can run here.

The catalogue (torch-free) says which models exist and which family each belongs to; this module finds the
family's torch half (``attnbench.families.<family>.layers``, its ``TORCH``) and asks it to build, and finds out,
with a tiny input, whether the kernel behind a case runs on this device and dtype. An unsupported backend is data
— a reason string — never an exception, so a sweep records ``status=unsupported`` and moves on. Nothing here
names a model.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from functools import cache

import torch
from torch import nn

from attnbench.core.cases import SERVING_PARAMS, Case
from attnbench.families.base import ExtraValue
from attnbench.families.catalogue import FAMILIES, MODELS, cannot_build, family_named, family_of, known, spec_of
from attnbench.families.serving import run_tiny, tiny_serving
from attnbench.families.states import decodable, prefill
from attnbench.families.torch_family import (
    PROBE_BATCH,
    PROBE_SEQ_LEN,
    LaunchLimit,
    TorchFamily,
    make_decode_inputs,
    make_input,
    one_line,
    package_problem,
    rng_untouched,
    torch_dtype,
)


@cache
def _torch_half(name: str) -> TorchFamily:
    module = importlib.import_module(f"{__package__}.{name}.layers")
    family = getattr(module, "TORCH", None)
    if not isinstance(family, TorchFamily):
        raise LookupError(f"attnbench.families.{name}.layers defines no TORCH family")
    return family


def torch_family(case: Case) -> TorchFamily:
    """The torch half of ``case``'s family."""
    return _torch_half(family_of(case).name)


def build_model(case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    """The model for ``case`` on ``device``: (B, T, d_model) -> (B, T, d_model).

    Weights come from torch's global generator, so they are fixed by a ``torch.manual_seed`` before the call;
    attention models that differ only in their core get identical weights.
    """
    if not known(case):
        raise ValueError(f"unknown model {case.model!r}; one of: {', '.join(MODELS)}")
    problem = cannot_build(case)
    if problem is not None:  # a case made by hand; a config refuses these before
        raise ValueError(f"{case.model}: {problem.message}")
    return torch_family(case).build(case, device, dtype)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _torch_halves() -> list[TorchFamily]:
    return [_torch_half(family.name) for family in FAMILIES]


def prepare_process() -> None:
    """Every family's process-wide settings, made once in a process that times cases (``TorchFamily``)."""
    for family in _torch_halves():
        family.prepare_process()


def process_settings() -> dict[str, bool | str | None]:
    """What every family's ``prepare_process`` sets, asked, not applied: recorded in run.json."""
    settings: dict[str, bool | str | None] = {}
    for family in _torch_halves():
        settings.update(family.process_settings())
    return settings


def call_context(case: Case, model: nn.Module) -> contextlib.AbstractContextManager[object]:
    """What ``case``'s family sets around every call of ``model`` (a forced backend, once, not per layer)."""
    return torch_family(case).call_context(case, model)


def row_extras(case: Case, device: str) -> dict[str, ExtraValue]:
    """What the row records of the implementation ``case`` runs on here (the family's declared extras)."""
    return torch_family(case).extras(case, device)


def launch_limit(case: Case, device_type: str) -> LaunchLimit | None:
    """The largest batch ``case``'s kernels launch on ``device_type`` whatever the memory, and why (the family's
    ``launch_limit``); None where nothing but memory bounds it."""
    return torch_family(case).launch_limit(case, device_type)


def probe(case: Case, device: str) -> str | None:
    """None if ``case``'s model runs on ``device`` (forward, and backward for ``train``), else why not.

    Cheap checks first (the catalogue's devices and package, whether the case can be built at all, the family's
    own: a kernel package, dtype limits), then a tiny input of batch 1 and 16 tokens with the case's other fields
    (decode: a context of 16, then one step). Never raises for an unsupported backend, dtype or device.
    """
    spec = spec_of(case)
    family = torch_family(case)
    device_type = torch.device(device).type
    if device_type not in spec.devices:
        needs = " or ".join(d.upper() for d in spec.devices)
        note = family.device_note(case.model)
        return f"{case.model} needs {needs}" + (f" ({note})" if note else "")
    if device_type == "cuda" and not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}, {torch.cuda.device_count()} devices)"
    if spec.package is not None:
        problem = package_problem(case.model, spec.package)
        if problem is not None:
            return problem
    buildable = cannot_build(case)
    if buildable is not None:
        return f"{case.model}: {buildable.message}" + (f" ({buildable.hint})" if buildable.hint else "")
    reason = family.unavailable(case, device_type)
    if reason is not None:
        return reason
    return _probe_tiny(case, device) if family.probes(case) else None


def _probe_tiny(case: Case, device: str) -> str | None:
    family = torch_family(case)
    tiny = family.tiny(case)
    with warnings.catch_warnings(record=True) as caught, rng_untouched(device):
        # Torch explains why a fused kernel was skipped in UserWarnings; keep every one for the reason.
        warnings.simplefilter("always")
        try:
            _run_tiny(tiny, device)
        except torch.cuda.OutOfMemoryError:
            raise  # a full device is not an unsupported backend; the executor records it as oom
        except (RuntimeError, NotImplementedError, ImportError) as exc:
            if "CUDA error" in str(exc):
                raise  # a broken device or context, not a missing kernel: the executor records it as error
            shape = "" if case.head_dim is None else f", head_dim {case.head_dim}"
            what = f"{family.label(case.model)}: no {case.mode} kernel for dtype {case.dtype}{shape} on {device}"
            details = dict.fromkeys(
                [f"{type(exc).__name__}: {one_line(str(exc))}", *(one_line(str(w.message)) for w in caught)]
            )
            return f"{what}: {'; '.join(d for d in details if d)}"
    return None


def _run_tiny(case: Case, device: str) -> None:
    if case.packing or case.mode in SERVING_PARAMS:  # a serving question: its own tiny call, timed as it will be
        case = tiny_serving(case)
    dtype = torch_dtype(case.dtype)
    model = build_model(case, device, dtype)
    if case.packing or case.mode in SERVING_PARAMS:
        grad = torch.inference_mode() if case.mode != "train" else contextlib.nullcontext()
        with grad, call_context(case, model):
            out = run_tiny(case, model, make_input(case, device, dtype))
            if out is not None and case.mode == "train":
                out.sum().backward()
    elif case.mode == "decode":
        context, token = make_decode_inputs(case, device, dtype)
        with torch.inference_mode():
            decodable(model).step(token, prefill(model, context, case.span))
    elif case.mode != "forward":  # train and backward both need the graph
        x = make_input(case, device, dtype)
        if x.is_floating_point():  # token ids take no gradient
            x.requires_grad_(True)
        model(x).sum().backward()
    else:
        with torch.inference_mode():  # as the executor times it: some kernels differ with grads off
            model(make_input(case, device, dtype))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # kernel launch errors are asynchronous; surface them here


def availability(device: str, dtype: str = "float32") -> dict[str, str | None]:
    """For every catalogue model: None if it runs on ``device`` in ``dtype``, else the reason it does not."""
    return {name: probe(_default_case(name, device, dtype), device) for name in MODELS}


def _default_case(model: str, device: str, dtype: str) -> Case:
    spec = MODELS[model]
    heads = 4 if spec.heads else None
    return Case(
        model,
        "forward",
        dtype,
        device,
        PROBE_BATCH,
        PROBE_SEQ_LEN,
        d_model=64,
        heads=heads,
        layers=1,
        causal=family_named(spec.family).causal(spec, {}, False),
    )


__all__ = [
    "availability",
    "build_model",
    "call_context",
    "make_decode_inputs",
    "make_input",
    "parameter_count",
    "prepare_process",
    "probe",
    "process_settings",
    "rng_untouched",
    "row_extras",
    "torch_dtype",
    "torch_family",
]
