"""Builders for every catalogue name, and the probe that says whether one can run here.

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

from attnbench.core.cases import Case
from attnbench.core.catalogue import DTYPES, MODEL_NAMES, MODELS, decode_problem
from attnbench.core.flops import positions, recurrent_hidden
from attnbench.measure.models.attention import (
    AttentionStack,
    FlashAttnCore,
    FlexCore,
    SdpaCore,
    SelfAttention,
    VanillaCore,
)
from attnbench.measure.models.blocks import Network, RecurrentBlock, Stack, TransformerBlock
from attnbench.measure.models.decoding import decodable, prefill
from attnbench.measure.models.linear import LinearAttention, LinearCore
from attnbench.measure.models.minrnn import MinCell, MinRNN, MinRNNStack, Scan
from attnbench.measure.models.positional import Rotary, input_encoding
from attnbench.measure.models.rnn import Cell, Recurrent

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
# The probe's input: large enough to take the real kernels' paths, small enough to cost nothing. The probe's
# model keeps the case's widths (the kernels depend on them) but one layer and a small vocabulary: building a
# BERT-base just to ask whether its kernels run here would cost seconds per case.
_PROBE_BATCH, _PROBE_SEQ_LEN, _PROBE_VOCAB = 1, 16, 64
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a catalogue dtype name (``"bfloat16"`` → ``torch.bfloat16``)."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of: {', '.join(DTYPES)}") from None


def _forced_core(model: str, causal: bool, window: int) -> nn.Module:
    backend = getattr(SDPBackend, _FORCED_BACKENDS[model], None)
    if backend is None:
        raise NotImplementedError(f"torch {torch.__version__} has no SDPBackend.{_FORCED_BACKENDS[model]}")
    return SdpaCore(causal, backend, window)


# Each builds a parameter-free core from (causal, window).
_CORES: dict[str, Callable[[bool, int], nn.Module]] = {
    "vanilla": VanillaCore,
    "sdpa": lambda causal, window: SdpaCore(causal, None, window),
    "flash-attn": FlashAttnCore,
    "flex": FlexCore,
    **{model: partial(_forced_core, model) for model in _FORCED_BACKENDS},
}


_ROPE_ON_RECURRENT = (
    "{model}: positional rope rotates attention's queries and keys, and a recurrent model has none; "
    "use sinusoidal or learned (added to the input), or none (a recurrence knows the order already)"
)


def _front(case: Case, device: str, dtype: torch.dtype) -> tuple[nn.Embedding | None, nn.Module | None]:
    """The token embedding (scope model) and the input positions, made before any layer: the order in which
    modules are made fixes which random numbers each weight gets, so it must not depend on the core."""
    embedding = None
    if case.option("scope") == "model":
        embedding = nn.Embedding(int(case.option("vocab")), case.d_model, device=device, dtype=dtype)
    kind = str(case.option("positional"))
    return embedding, input_encoding(kind, case.d_model, positions(case), device=device, dtype=dtype)


def _network(
    case: Case, body: nn.Module, front: tuple[nn.Embedding | None, nn.Module | None], device: str, dtype: torch.dtype
) -> nn.Module:
    embedding, positional = front
    if case.option("scope") != "model":
        return body if positional is None else Network(body, positional=positional)
    final_norm = nn.LayerNorm(case.d_model, device=device, dtype=dtype)
    return Network(body, embedding=embedding, positional=positional, final_norm=final_norm)


def _build_recurrent(cell: Cell | MinCell, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    if case.option("positional") == "rope":
        raise ValueError(_ROPE_ON_RECURRENT.format(model=case.model))
    front = _front(case, device, dtype)
    torch_cell = cell == "lstm" or cell == "gru"
    bidirectional = torch_cell and bool(case.option("bidirectional"))
    scan: Scan = "parallel" if torch_cell or case.option("scan") == "parallel" else "sequential"
    if case.option("scope") == "core":
        if cell == "lstm" or cell == "gru":
            body: nn.Module = Recurrent(
                cell, case.d_model, case.layers, bidirectional=bidirectional, device=device, dtype=dtype
            )
        else:
            body = MinRNNStack(cell, case.d_model, case.layers, scan=scan, device=device, dtype=dtype)
        return _network(case, body, front, device, dtype)
    hidden = recurrent_hidden(case)  # d_model per direction, or matched to the attention block's parameters
    directions = 2 if bidirectional else 1

    def layer() -> nn.Module:
        if cell == "lstm" or cell == "gru":
            return Recurrent(
                cell, case.d_model, 1, bidirectional=bidirectional, device=device, dtype=dtype, hidden=hidden
            )
        return MinRNN(cell, case.d_model, hidden, scan=scan, device=device, dtype=dtype)

    blocks = [
        RecurrentBlock(layer(), directions * hidden, case.d_model, device=device, dtype=dtype)
        for _ in range(case.layers)
    ]
    return _network(case, Stack(*blocks), front, device, dtype)


def _linear_core(case: Case) -> nn.Module:
    return LinearCore(
        str(case.option("form")),
        str(case.option("feature")),
        case.option("decay") == "retnet",
        int(case.option("chunk")),
    )


def _build_attention(model: str, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
    """Attention layers (or blocks) around the model's core; linear-attn is the same layer with a linear core."""
    if case.heads is None or case.head_dim is None:
        raise ValueError(f"attention model {model!r} needs heads")
    front = _front(case, device, dtype)
    layer_type = LinearAttention if model == "linear-attn" else SelfAttention

    def make_core(causal: bool, window: int) -> nn.Module:
        return _linear_core(case) if model == "linear-attn" else _CORES[model](causal, window)

    rotary = None
    if case.option("positional") == "rope":
        # One table shared by every layer: it holds no parameters, only cos/sin of the positions.
        rotary = Rotary(case.head_dim, case.span, device=device, dtype=dtype)

    def attention() -> SelfAttention:
        return layer_type(
            case.d_model,
            case.heads or 0,
            make_core(case.causal, case.window),
            device=device,
            dtype=dtype,
            rotary=rotary,
            heads_kv=case.heads_kv,
        )

    if case.option("scope") == "core":
        return _network(case, AttentionStack([attention() for _ in range(case.layers)]), front, device, dtype)
    ffn_mult = int(case.option("ffn_mult"))
    blocks = [
        TransformerBlock(attention(), case.d_model, ffn_mult, device=device, dtype=dtype) for _ in range(case.layers)
    ]
    return _network(case, Stack(*blocks), front, device, dtype)


BUILDERS: dict[str, Builder] = {
    "lstm": partial(_build_recurrent, "lstm"),
    "gru": partial(_build_recurrent, "gru"),
    "mingru": partial(_build_recurrent, "mingru"),
    "minlstm": partial(_build_recurrent, "minlstm"),
    **{model: partial(_build_attention, model) for model in _CORES},
    "linear-attn": partial(_build_attention, "linear-attn"),
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
    """The tensor one call of the case's model takes: activations (B, T, d_model) in the case's dtype, or at
    scope model int64 token ids (B, T), uniform over the vocabulary (they need, and get, no gradient)."""
    if case.option("scope") == "model":
        return torch.randint(0, int(case.option("vocab")), (case.batch, case.seq_len), device=device)
    return torch.randn(case.batch, case.seq_len, case.d_model, device=device, dtype=dtype)


def make_decode_inputs(case: Case, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode case's context (n tokens per sequence, as ``make_input``) and the one new token per sequence."""
    return make_input(case, device, dtype), make_input(replace(case, seq_len=1), device, dtype)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _label(model: str) -> str:
    return _FORCED_BACKENDS.get(model, model)


def probe(case: Case, device: str) -> str | None:
    """None if ``case``'s model runs on ``device`` (forward, and backward for ``train``), else why not.

    Cheap checks first (the catalogue's devices and package, known dtype limits), then a tiny input of batch 1
    and 16 tokens with the case's other fields (decode: a context of 16, then one step). Never raises for an
    unsupported backend, dtype or device.
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
    problem = option_problem(case) or _kernel_problem(case, device_type)
    if problem is not None:
        return problem
    return _probe_tiny(case, device)


def _kernel_problem(case: Case, device_type: str) -> str | None:
    """Why an option-chosen package kernel (linear-attn's kernel: fla) cannot run here, found before building."""
    if case.model != "linear-attn" or case.option("kernel") != "fla":
        return None
    if device_type != "cuda":
        return "linear-attn kernel fla: flash-linear-attention's kernels are Triton, CUDA only"
    if case.option("decay") != "none":
        return "linear-attn kernel fla: chunk_linear_attn has no decay (use kernel torch for decay retnet)"
    try:
        importlib.import_module("fla.ops.linear_attn")
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "fla":
            return "linear-attn kernel fla: package fla (flash-linear-attention) is not installed"
        return f"linear-attn kernel fla: package fla does not import: {_one_line(str(exc))}"
    return None


def option_problem(case: Case) -> str | None:
    """Why the case's options describe no model that can be built (a config refuses these; a case made by hand
    may still carry one), or None. Checked on the real case, before the probe shrinks it."""
    if case.mode == "decode":
        problem = decode_problem(case.model, case.causal)
        if problem is not None:
            return problem
    positional = case.option("positional")
    if positional == "rope":
        if case.family == "recurrent":
            return _ROPE_ON_RECURRENT.format(model=case.model)
        if case.head_dim is not None and case.head_dim % 2:
            return f"{case.model}: rope rotates pairs of features, so head_dim must be even, got {case.head_dim}"
    max_len = int(case.option("max_len"))
    if positional == "learned" and 0 < max_len < case.span:
        needs = f"seq_len {case.seq_len}"
        if case.mode == "decode":
            needs = f"the {case.span} positions of a decode step at n={case.seq_len}"
        return f"{case.model}: learned positions cover max_len={max_len} tokens, fewer than {needs}"
    if case.family == "recurrent" and case.heads is None:
        try:
            recurrent_hidden(case)
        except ValueError as exc:
            return str(exc)
    return None


def _tiny(case: Case) -> Case:
    """The case at the probe's size: batch 1, 16 tokens, one layer, a small vocabulary; its widths kept."""
    options = dict(case.options)
    if "vocab" in options or case.option("scope") == "model":
        options["vocab"] = min(_PROBE_VOCAB, int(case.option("vocab")))
    if int(case.option("max_len")):
        options["max_len"] = _PROBE_SEQ_LEN + (case.span - case.seq_len)  # a decode also needs position n
    return replace(case, batch=_PROBE_BATCH, seq_len=_PROBE_SEQ_LEN, layers=1, options=tuple(sorted(options.items())))


def _probe_tiny(case: Case, device: str) -> str | None:
    tiny = _tiny(case)
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
    if case.mode == "decode":
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
    heads = 4 if MODELS[model].heads else None
    return Case(
        model,
        "forward",
        dtype,
        device,
        _PROBE_BATCH,
        _PROBE_SEQ_LEN,
        d_model=64,
        heads=heads,
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
    A decode step asks with its own shapes: one query against the n + 1 keys of a (B, H, n + 1, D) cache.
    """
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None or case.heads is None or case.head_dim is None:
        return None
    train = case.mode in ("train", "backward")  # backward mode dispatches as train does: a graph is kept
    dtype = torch_dtype(case.dtype)
    try:
        with torch.set_grad_enabled(train):
            kv_heads = case.heads_kv or case.heads
            gqa = kv_heads != case.heads
            mask = None
            if case.mode == "decode":
                keys = min(case.span, case.window) if case.window else case.span
                q = torch.empty(case.batch, case.heads, 1, case.head_dim, device=device, dtype=dtype)
                k = v = torch.empty(case.batch, kv_heads, keys, case.head_dim, device=device, dtype=dtype)
                causal = False
            else:
                d, width = case.head_dim, (case.heads + 2 * kv_heads) * case.head_dim
                qkv = torch.empty(
                    case.batch, case.seq_len, width, device=device, dtype=dtype, requires_grad=train
                )  # (B, T, (H + 2·H_kv)·D), split as SelfAttention splits it
                q_, k_, v_ = qkv.split([case.heads * d, kv_heads * d, kv_heads * d], dim=-1)
                q = q_.view(case.batch, case.seq_len, case.heads, d).transpose(1, 2)
                k = k_.view(case.batch, case.seq_len, kv_heads, d).transpose(1, 2)
                v = v_.view(case.batch, case.seq_len, kv_heads, d).transpose(1, 2)
                causal = case.causal and not case.window
                if case.window:  # the band goes in as an explicit mask, as SdpaCore passes it
                    mask = torch.ones(case.seq_len, case.seq_len, dtype=torch.bool, device=device)
            index = int(
                choose(q, k, v, mask, 0.0, causal, enable_gqa=gqa) if gqa else choose(q, k, v, mask, 0.0, causal)
            )
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # includes OOM for a case too big to hold even its inputs: that case will say so itself
    name = _BACKEND_NAMES.get(index)
    return None if name in (None, "ERROR") else name


# The operator that gives each implementation of torch.nn.LSTM/GRU away, in the order they are looked for. bf16
# LSTM/GRU run on cuDNN only where torch was built against cuDNN 9.13+ (and on sm80+); elsewhere CUDA runs fused
# cells step by step. On a CPU, oneDNN takes LSTM (float32, bf16) and everything else is a loop of aten ops.
RNN_PATHS: tuple[tuple[str, str], ...] = (
    ("aten::_cudnn_rnn", "cudnn"),
    ("aten::miopen_rnn", "miopen"),
    ("aten::mkldnn_rnn_layer", "onednn"),
    ("aten::_thnn_fused_lstm_cell", "fused-cell-loop"),
    ("aten::_thnn_fused_gru_cell", "fused-cell-loop"),
)
RNN_LOOP = "aten-loop"  # none of the above: one aten matmul and element-wise ops per step, from Python-free C++


def rnn_path(case: Case, device: str) -> str | None:
    """Which implementation ``case``'s LSTM/GRU runs on (``RNN_PATHS``, else ``RNN_LOOP``); None for other models.

    Found, not predicted: one forward of the probe-sized model under the profiler (operator names only, as the
    host dispatched them, whatever the device), outside any timed region. The choice depends on device, dtype,
    cuDNN's build and flags, not on sizes. autograd's own profiler, not kineto's: this needs only the names, and
    the first kineto profile of a process imports torch._dynamo (1.4-1.9 s, against 20 ms for this)."""
    if case.model not in ("lstm", "gru"):
        return None
    from torch.autograd.profiler import profile

    tiny = _tiny(case)
    dtype = torch_dtype(case.dtype)
    with _rng_untouched(device):
        model, x = build_model(tiny, device, dtype), make_input(tiny, device, dtype)
        grad = torch.inference_mode() if case.mode == "forward" else contextlib.nullcontext()
        with grad, profile(use_kineto=False) as prof:
            model(x)
    names = {event.name for event in prof.function_events}
    return next((path for op, path in RNN_PATHS if op in names), RNN_LOOP)
