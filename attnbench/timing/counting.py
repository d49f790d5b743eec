"""FLOPs of one call of a model with no formula of its own (a user's), counted on the device by torch's
``FlopCounterMode`` (formula ``counted-v1``), with the two corrections a stored count needs to mean what a
built-in's means:

- **Causal attention.** torch's SDPA formulas ignore ``is_causal`` (``sdpa_flop``: "We aren't accounting for causal
  attention here"), so a causal user transformer would be credited every (query, key) pair where a built-in is
  credited the pairs its mask keeps (``shared.causal_pairs``): twice the attention FLOPs at long n. The fused SDPA
  ops are counted here with torch's own formulas scaled to the kept pairs, the CPU flash kernel (which torch has
  no formula for) included. The math path (matmuls on the full score matrix, masked after) is counted as executed.
- **Ops without a formula.** An op that does a model's matrix products but that the counter has no formula for
  (``_cudnn_rnn``, oneDNN's RNN layer, a package's custom op such as flash_attn's, a Triton kernel launched from
  Python as fla and mamba_ssm do) counts 0, and the row would store a count that leaves it out as if it were a
  measurement. Every op the call dispatches is seen (a ``TorchDispatchMode`` beside the counter), Triton launches
  too where Triton is loaded; when one without a formula ran, no FLOPs are stored and the row says which ops.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnbench.families.shared import causal_pairs

__all__ = ["Counted", "count_call"]

# aten ops that do a layer's matrix products inside one kernel and that FlopCounterMode has no formula for (by
# overload packet, as str() names one).
UNCOUNTED_ATEN = frozenset(
    {
        "aten._cudnn_rnn",
        "aten._cudnn_rnn_backward",
        "aten.miopen_rnn",
        "aten.miopen_rnn_backward",
        "aten.mkldnn_rnn_layer",
        "aten.mkldnn_rnn_layer_backward",
        "aten.lstm",
        "aten.gru",
        "aten.rnn_tanh",
        "aten.rnn_relu",
        "aten._transformer_encoder_layer_fwd",
        "aten._native_multi_head_attention",
        "aten._addmm_activation",
        "aten._int_mm",
        "aten._weight_int4pack_mm",
        "aten._weight_int8pack_mm",
        "aten.addmv",
        "aten.mv",
        "aten.addr",
        "aten._scaled_dot_product_fused_attention_overrideable",
        "aten._scaled_dot_product_fused_attention_overrideable_backward",
    }
)
# Namespaces whose ops do no arithmetic worth counting (bookkeeping, profiler annotations, collectives).
_QUIET_NAMESPACES = frozenset({"aten", "prims", "prim", "profiler", "c10d", "_c10d_functional", "_dtensor"})
# SDPA's fused ops (all (B, H, T, D)), with torch's formula that counts them unmasked and how many of their first
# arguments it takes: q, k, v, or for a backward the output's gradient, q, k, v.
_FORWARD, _BACKWARD = ("sdpa_flop_count", 3), ("sdpa_backward_flop_count", 4)
_FUSED_SDPA: dict[str, tuple[str, int]] = {
    "_scaled_dot_product_flash_attention": _FORWARD,
    "_scaled_dot_product_efficient_attention": _FORWARD,
    "_scaled_dot_product_cudnn_attention": _FORWARD,
    "_scaled_dot_product_flash_attention_for_cpu": _FORWARD,
    "_scaled_dot_product_flash_attention_backward": _BACKWARD,
    "_scaled_dot_product_efficient_attention_backward": _BACKWARD,
    "_scaled_dot_product_cudnn_attention_backward": _BACKWARD,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _BACKWARD,
}


@dataclass(frozen=True)
class Counted:
    """What counting one call found: its FLOPs, or None where ``uncounted`` names ops that ran without a formula."""

    flops: int | None
    uncounted: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        """Why no FLOPs are stored, in a row's words ("" when they are)."""
        if not self.uncounted:
            return ""
        return (
            f"ops without a FLOP formula ran ({', '.join(self.uncounted)}): a count leaving them out is not the "
            "model's work, so none is stored"
        )


def _is_causal(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The ``is_causal`` a call of the op ``schema`` describes was given (its default where it was left out)."""
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    for index, argument in enumerate(schema.arguments):
        if argument.name == "is_causal":
            return bool(args[index] if index < len(args) else argument.default_value)
    return False


def _causal_sdpa(packet: Any, base: str, tensors: int) -> Callable[..., int]:
    """A raw FlopCounterMode formula for one fused SDPA op: torch's unmasked count, times the share of (query, key)
    pairs a causal mask keeps where the call asked for one (top-left aligned, as torch's ``is_causal`` is)."""
    from torch.utils import flop_counter

    unmasked = getattr(flop_counter, base)
    schema = packet.default._schema

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        shapes = [tuple(t.shape) for t in args[:tensors]]
        flops = int(unmasked(*shapes))
        query, key = shapes[tensors - 3], shapes[tensors - 2]  # (B, H, T, D)
        q_len, k_len = query[-2], key[-2]
        if not _is_causal(schema, args, kwargs) or not q_len or not k_len:
            return flops
        return flops * causal_pairs(q_len, k_len) // (q_len * k_len)

    formula._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: pass tensors, not shapes
    return formula


def causal_formulas() -> dict[Any, Callable[..., int]]:
    """The fused SDPA ops this torch has, each with its causal-aware formula (FlopCounterMode's ``custom_mapping``)."""
    mapping: dict[Any, Callable[..., int]] = {}
    for name, (base, tensors) in _FUSED_SDPA.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            mapping[packet] = _causal_sdpa(packet, base, tensors)
    return mapping


class _OpsSeen(TorchDispatchMode):
    """Every op dispatched inside it, by overload packet."""

    def __init__(self) -> None:
        super().__init__()
        self.packets: set[Any] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.packets.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def without_formula(packets: set[Any], registry: dict[Any, Any]) -> list[str]:
    """The names of the ops in ``packets`` that do uncounted arithmetic: no formula in ``registry``, and either an
    aten op known to hide matrix products (``UNCOUNTED_ATEN``) or an op of a package's own namespace."""
    names = []
    for packet in packets:
        if packet in registry:
            continue
        if str(packet) in UNCOUNTED_ATEN or str(packet).partition(".")[0] not in _QUIET_NAMESPACES:
            names.append(str(packet))
    return sorted(names)


@contextlib.contextmanager
def triton_launches() -> Iterator[list[str]]:
    """The names of the Triton kernels launched from Python inside it (fla's, mamba_ssm's: they never reach the
    dispatcher), where Triton is loaded; nothing where it is not (then no Triton kernel can have run). Counts
    ``JITFunction.run``, through which ``kernel[grid](...)`` and the autotuner launch."""
    launched: list[str] = []
    jit = sys.modules.get("triton.runtime.jit")
    function = getattr(jit, "JITFunction", None)
    real = getattr(function, "run", None)
    if function is None or real is None:
        yield launched
        return

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(str(getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "?")))
        return real(self, *args, **kwargs)

    function.run = run
    try:
        yield launched
    finally:
        function.run = real


def count_call(step: Callable[[], object]) -> Counted:
    """FLOPs of one call of ``step`` as FlopCounterMode counts them (matrix products, forward and, for a train step,
    backward), causal SDPA credited the pairs its mask keeps; no count where an op without a formula ran."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=causal_formulas())
    seen = _OpsSeen()
    with triton_launches() as launched, counter, seen:
        step()
    uncounted = without_formula(seen.packets, counter.flop_registry)
    uncounted += [f"triton:{name}" for name in sorted(set(launched))]
    if uncounted:
        return Counted(None, tuple(uncounted))
    return Counted(int(counter.get_total_flops()))
