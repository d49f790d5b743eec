"""Analytic floating-point operation counts per case (issue 3, item 2).

Layer 1, pure Python: a report computes ``tflops`` and ``pct_of_peak`` from a stored row without torch. Every
count carries a ``formula`` id (family and version) that goes into the row beside it, so a later change of
convention shows up as a new id rather than silently changing old numbers.

Conventions, shared by every formula:

* a multiply-add counts 2 FLOPs, as in the FlashAttention paper's benchmarks and in Kaplan et al. 2020
  (arXiv:2001.08361, §2.1: a forward pass costs ≈ 2·N FLOPs per token for N weights of matmul);
* only matrix products are counted. Bias adds, the softmax, the 1/√D scale, the causal mask and the
  element-wise gate math of LSTM/GRU cells are left out: they are O(size of the output), not O(inner dim)
  times that, and counting them would make the numbers disagree with the field's (and with
  ``torch.utils.flop_counter.FlopCounterMode``, which counts matmuls only);
* ``train`` is one forward plus one backward; ``forward`` is the forward alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from attnbench.cases import Case

ATTENTION_FORMULA = "attention-v1"
LSTM_FORMULA = "lstm-v1"
GRU_FORMULA = "gru-v1"

# Backward / forward FLOP ratios.
# The attention core's backward is 5 matmuls against the forward's 2 (QKᵀ recomputed, then dV, dP, dQ, dK), so
# 2.5× the forward: the convention of FlashAttention's benchmarks (Dao 2023, FlashAttention-2 §4.1;
# Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, ``flops``). Kept as a fraction so counts
# stay exact integers (4·… × 5/2 is always whole).
_CORE_BACKWARD = (5, 2)
# A matmul Y = X·W needs dX = dY·Wᵀ and dW = Xᵀ·dY in backward: twice its forward (Kaplan et al. 2020, §2.1).
_MATMUL_BACKWARD = 2
# Matmuls per cell step: LSTM has 4 gates (i, f, g, o), GRU 3 (r, z, n); each is an (I+H)→H product.
_GATES = {"lstm": 4, "gru": 3}
_RNN_FORMULAS = {"lstm": LSTM_FORMULA, "gru": GRU_FORMULA}


@dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one call of a case's mode, the formula that gave them, and the parts they add up from.

    ``detail`` names the forward parts (``projections``, ``core`` for attention; ``gates`` for recurrent
    models) and, for ``train``, their backward counterparts (``projections_backward``, …). ``flops`` is their
    sum.
    """

    flops: int
    formula: str
    detail: Mapping[str, int]


def count_flops(case: Case) -> FlopCount:
    """Analytic FLOPs of one ``case.mode`` call of ``case`` (a multiply-add counts 2). See the module notes."""
    if case.family == "attention":
        formula, forward, backward = ATTENTION_FORMULA, *_attention(case)
    else:
        formula, forward, backward = _recurrent(case)
    # forward counts the forward pass, backward the backward pass alone, train both.
    detail = dict(forward) if case.mode != "backward" else {}
    if case.mode != "forward":
        detail.update({f"{name}_backward": flops for name, flops in backward.items()})
    return FlopCount(flops=sum(detail.values()), formula=formula, detail=MappingProxyType(detail))


def causal_pairs(q_len: int, k_len: int) -> int:
    """How many (query, key) pairs a causal mask keeps: Σ_{i<q_len} min(i+1, k_len).

    Top-left aligned, as torch's ``is_causal=True`` is: query i sees keys 0..i, whatever ``k_len``. Closed
    form of the sum: a triangle for the first min(q_len, k_len) rows, then full rows of ``k_len``.
    """
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be ≥ 0, got q_len={q_len}, k_len={k_len}")
    rows = min(q_len, k_len)
    return rows * (rows + 1) // 2 + (q_len - rows) * k_len


def _attention(case: Case) -> tuple[dict[str, int], dict[str, int]]:
    """Forward and backward parts of ``case.layers`` self-attention layers (attnbench.models.attention)."""
    if case.heads is None or case.heads <= 0 or case.d_model % case.heads:
        raise ValueError(f"attention case needs heads dividing d_model={case.d_model}, got heads={case.heads}")
    b, s, d = case.batch, case.seq_len, case.d_model
    # Projections: the fused qkv Linear(d, 3d) and the out Linear(d, d) are 4·d² weights applied to B·S tokens,
    # 2 FLOPs each (issue 3: 2·B·S·d_model²·4). Bias adds are not counted.
    projections = 2 * b * s * d * d * 4
    # Core: QKᵀ and P·V each take D multiply-adds per kept (query, key) pair and head: 2·2·B·H·D per pair,
    # i.e. 4·B·H·Sq·Sk·D unmasked (FlashAttention's benchmark count). Causal counts the pairs the mask keeps
    # exactly, where FlashAttention's benchmark halves: S(S+1)/2, not S²/2, which matters at short lengths (and
    # causal_pairs handles Sq ≠ Sk). Self-attention here: Sq = Sk = S and H·D = d_model.
    pairs = causal_pairs(s, s) if case.causal else s * s
    core = 4 * b * d * pairs
    numerator, denominator = _CORE_BACKWARD
    forward = {"projections": case.layers * projections, "core": case.layers * core}
    backward = {
        "projections": _MATMUL_BACKWARD * forward["projections"],
        "core": forward["core"] * numerator // denominator,
    }
    return forward, backward


def _recurrent(case: Case) -> tuple[str, dict[str, int], dict[str, int]]:
    """Forward and backward of a torch.nn.LSTM/GRU stack as attnbench.models.rnn builds it."""
    cell = case.model
    if cell not in _GATES:
        raise ValueError(f"no FLOP formula for recurrent model {cell!r}; known: {', '.join(_GATES)}")
    bidirectional = bool(case.option("bidirectional"))
    directions = 2 if bidirectional else 1
    if bidirectional and case.d_model % 2:
        raise ValueError(f"bidirectional {cell} needs an even d_model, got {case.d_model}")
    hidden = case.d_model // directions
    gates = 0
    for layer in range(case.layers):
        inputs = case.d_model if layer == 0 else hidden * directions
        # Per step and direction each gate is an (I+H)→H matmul: 2·gates·B·T·H·(I+H) in all, i.e.
        # LSTM 8·B·T·H·(I+H), GRU 6·B·T·H·(I+H) (issue 3). Element-wise gate math is not counted.
        gates += directions * 2 * _GATES[cell] * case.batch * case.seq_len * hidden * (inputs + hidden)
    # Backward ≈ 2× forward (both dX/dh and dW per matmul). Exactly, autograd skips dh₀ at the first step
    # (h₀ = 0 needs no gradient): one step's hidden matmuls per layer and direction, a 1/T-sized difference.
    return _RNN_FORMULAS[cell], {"gates": gates}, {"gates": _MATMUL_BACKWARD * gates}
