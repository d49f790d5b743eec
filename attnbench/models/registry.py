"""Builders for every catalogue name, and the probe that says whether one can run here (DESIGN §6).

The catalogue (torch-free) says which names exist; this module says how to build each and finds out, with a
tiny input, whether the kernel behind it runs on this device and dtype. An unsupported backend is data — a
reason string — never an exception, so a sweep records ``status=unsupported`` and moves on.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import torch
from torch import nn
from torch.nn.attention import SDPBackend

from attnbench.cases import Case
from attnbench.catalogue import DTYPES, MODEL_NAMES, MODELS
from attnbench.models.attention import AttentionStack, FlashAttnCore, SdpaCore, SelfAttention, VanillaCore
from attnbench.models.rnn import Cell, Recurrent

Builder = Callable[[Case, str, torch.dtype], nn.Module]

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}

# The SDPA backend each forced model pins, by SDPBackend member name (CUDNN_ATTENTION is new in torch 2.5).
_FORCED_BACKENDS = {
    "sdpa-math": "MATH",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}
# Why a model is missing on a device the catalogue leaves out, for the cheap check before any probing.
_DEVICE_NOTES = {
    "sdpa-efficient": "EFFICIENT_ATTENTION has no CPU kernel",
    "sdpa-cudnn": "CUDNN_ATTENTION runs on cuDNN, which is GPU-only",
    "flash-attn": "the flash_attn package ships CUDA kernels only",
}
# dtypes a model supports at all, where narrower than catalogue.DTYPES (flash_attn_func: fp16/bf16 only).
_DTYPE_LIMITS = {"flash-attn": ("float16", "bfloat16")}
# The probe's input: large enough to take the real kernels' paths, small enough to cost nothing.
_PROBE_BATCH, _PROBE_SEQ_LEN = 1, 16
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a catalogue dtype name (``"bfloat16"`` → ``torch.bfloat16``)."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of: {', '.join(DTYPES)}") from None


def _forced_core(model: str, causal: bool) -> nn.Module:
    backend = getattr(SDPBackend, _FORCED_BACKENDS[model], None)
    if backend is None:
        raise NotImplementedError(f"torch {torch.__version__} has no SDPBackend.{_FORCED_BACKENDS[model]}")
    return SdpaCore(causal, backend)


_CORES: dict[str, Callable[[bool], nn.Module]] = {
    "vanilla": VanillaCore,
    "sdpa": SdpaCore,
    "flash-attn": FlashAttnCore,
    **{model: partial(_forced_core, model) for model in _FORCED_BACKENDS},
}


def _build_recurrent(cell: Cell, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    return Recurrent(
        cell, case.d_model, case.layers, bidirectional=bool(case.option("bidirectional")), device=device, dtype=dtype
    )


def _build_attention(model: str, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    if case.heads is None:
        raise ValueError(f"attention model {model!r} needs heads")
    make_core = _CORES[model]
    return AttentionStack(
        [
            SelfAttention(case.d_model, case.heads, make_core(case.causal), device=device, dtype=dtype)
            for _ in range(case.layers)
        ]
    )


BUILDERS: dict[str, Builder] = {
    "lstm": partial(_build_recurrent, "lstm"),
    "gru": partial(_build_recurrent, "gru"),
    **{model: partial(_build_attention, model) for model in _CORES},
}


def build_model(case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    """The model for ``case`` on ``device``: (B, T, d_model) -> (B, T, d_model).

    Weights come from torch's global generator, so they are fixed by a ``torch.manual_seed`` before the call;
    attention models that differ only in their core get identical weights.
    """
    try:
        builder = BUILDERS[case.model]
    except KeyError:
        raise ValueError(f"unknown model {case.model!r}; one of: {', '.join(MODEL_NAMES)}") from None
    return builder(case, device, dtype)


def make_input(case: Case, device: str, dtype: torch.dtype) -> torch.Tensor:
    """The tensor one call of the case's model takes: activations (B, T, d_model) in the case's dtype."""
    return torch.randn(case.batch, case.seq_len, case.d_model, device=device, dtype=dtype)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _label(model: str) -> str:
    return _FORCED_BACKENDS.get(model, model)


def probe(case: Case, device: str) -> str | None:
    """None if ``case``'s model runs on ``device`` (forward, and backward for ``train``), else why not.

    Cheap checks first (the catalogue's devices and package, known dtype limits), then a tiny input of batch 1
    and 16 tokens with the case's other fields. Never raises for an unsupported backend, dtype or device.
    """
    spec = MODELS[case.model]
    device_type = torch.device(device).type
    if device_type not in spec.devices:
        note = _DEVICE_NOTES.get(case.model)
        needs = " or ".join(d.upper() for d in spec.devices)
        return f"{case.model} needs {needs}" + (f" ({note})" if note else "")
    if device_type == "cuda" and not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}, {torch.cuda.device_count()} devices)"
    if spec.package is not None:
        try:
            importlib.import_module(spec.package)
        except ImportError as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name == spec.package:
                return f"{case.model}: package {spec.package} is not installed"
            return f"{case.model}: package {spec.package} does not import: {_one_line(str(exc))}"
    allowed = _DTYPE_LIMITS.get(case.model)
    if allowed is not None and case.dtype not in allowed:
        return f"{case.model}: supports only {' and '.join(allowed)}, not {case.dtype}"
    return _probe_tiny(case, device)


def _probe_tiny(case: Case, device: str) -> str | None:
    tiny = replace(case, batch=_PROBE_BATCH, seq_len=_PROBE_SEQ_LEN)
    with warnings.catch_warnings(record=True) as caught, _rng_untouched(device):
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
            what = f"{_label(case.model)}: no {case.mode} kernel for dtype {case.dtype}{shape} on {device}"
            details = dict.fromkeys(
                [f"{type(exc).__name__}: {_one_line(str(exc))}", *(_one_line(str(w.message)) for w in caught)]
            )
            return f"{what}: {'; '.join(d for d in details if d)}"
    return None


def _run_tiny(case: Case, device: str) -> None:
    dtype = torch_dtype(case.dtype)
    model = build_model(case, device, dtype)
    x = make_input(case, device, dtype)
    if case.mode != "forward":  # train and backward both need the graph
        x.requires_grad_(True)
        model(x).sum().backward()
    else:
        with torch.inference_mode():  # as the executor times it: some kernels differ with grads off
            model(x)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # kernel launch errors are asynchronous; surface them here


@contextlib.contextmanager
def _rng_untouched(device: str) -> Iterator[None]:
    """Building the probe's model draws random weights; leave the caller's generator state as it was."""
    dev = torch.device(device)
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        yield


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(_TRIGGERED.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def availability(device: str, dtype: str = "float32") -> dict[str, str | None]:
    """For every catalogue model: None if it runs on ``device`` in ``dtype``, else the reason it does not."""
    return {name: probe(_default_case(name, device, dtype), device) for name in MODEL_NAMES}


def _default_case(model: str, device: str, dtype: str) -> Case:
    recurrent = MODELS[model].family == "recurrent"
    return Case(
        model,
        "forward",
        dtype,
        device,
        _PROBE_BATCH,
        _PROBE_SEQ_LEN,
        d_model=64,
        heads=None if recurrent else 4,
        layers=1,
        causal=recurrent,
    )


# SDPBackend is a pybind11 enum: SDPBackend(99) does not raise, so map the int back through its members.
_BACKEND_NAMES: dict[int, str] = {member.value: name for name, member in SDPBackend.__members__.items()}


def sdpa_kernel_chosen(case: Case, device: str) -> str | None:
    """Which SDPA backend PyTorch's own dispatch picks for ``case`` (e.g. ``"FLASH_ATTENTION"``), or None.

    Asks ``torch._fused_sdp_choice`` (private, hence the guards) with q, k, v shaped and strided exactly as
    ``SelfAttention`` hands them to the core, with grads on for ``train``: the dispatcher looks at strides,
    head dim, dtype, device and whether a backward is needed. ``torch.empty`` does no work and is freed at
    once; meta tensors would not do, since dispatch on ``meta`` answers MATH whatever the real device would.
    """
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None or case.heads is None or case.head_dim is None:
        return None
    train = case.mode != "forward"  # backward mode dispatches as train does: a graph is kept
    try:
        with torch.set_grad_enabled(train):
            qkv = torch.empty(
                case.batch,
                case.seq_len,
                3,
                case.heads,
                case.head_dim,
                device=device,
                dtype=torch_dtype(case.dtype),
                requires_grad=train,
            )  # (B, T, 3, H, D)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (B, H, T, D)
            index = int(choose(q, k, v, None, 0.0, case.causal))
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # includes OOM for a case too big to hold even its inputs: that case will say so itself
    name = _BACKEND_NAMES.get(index)
    return None if name in (None, "ERROR") else name
