"""Analytic floating-point operation and parameter counts per case (issue 3, item 2; issue 7).

Pure Python: a report computes ``tflops`` and ``pct_of_peak`` from a stored row without torch. Every
count carries a ``formula`` id (family, scope and version) that goes into the row beside it, so a later change
of convention shows up as a new id rather than silently changing old numbers.

This is also the one torch-free place that knows every model's shapes, so the sizes FLOPs depend on live here
too: the hidden width of a recurrent block (``recurrent_hidden``; ``match: params`` searches it) and the
parameter count of a case (``count_parameters``), which config validation and the presets use without torch and
the models build from (a test holds ``count_parameters`` equal to the built module's).

Conventions, shared by every formula:

* a multiply-add counts 2 FLOPs, as in the FlashAttention paper's benchmarks and in Kaplan et al. 2020
  (arXiv:2001.08361, §2.1: a forward pass costs ≈ 2·N FLOPs per token for N weights of matmul);
* only matrix products are counted. Bias adds, the softmax, the 1/√D scale, the causal mask, the element-wise
  gate math of LSTM/GRU cells, the minGRU/minLSTM scans, LayerNorm, GELU, residual adds, positional encodings
  (RoPE included) and the embedding lookup are left out: they are O(size of the output), not O(inner dim)
  times that, and counting them would make the numbers disagree with the field's (and with
  ``torch.utils.flop_counter.FlopCounterMode``, which counts matmuls only);
* ``train`` is one forward plus one backward; ``forward`` is the forward alone;
* ``decode`` is one step at context n: every matmul applied to one token per sequence, and attention's core over
  the n + 1 keys the new token sees (the context and itself), without a mask. Its ids end in ``-decode-v1``.
* FLOPs are *useful* work: a causal core is credited the (query, key) pairs its mask keeps. Cores that compute
  every pair and mask afterwards (``vanilla``; SDPA's math backend, forced or chosen by dispatch) execute the full
  n² as well: ``executed_flops`` counts that, and a row stores both (``flops``, ``executed_flops``). The fused
  kernels skip masked tiles, so for them the two agree (counted pair by pair, not tile by tile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from attnbench.core.cases import Case
from attnbench.core.catalogue import MATCH_TOLERANCE

ATTENTION_FORMULA = "attention-v1"
ATTENTION_BLOCK_FORMULA = "attention-block-v1"
TRANSFORMER_FORMULA = "transformer-model-v1"
LSTM_FORMULA = "lstm-v1"
GRU_FORMULA = "gru-v1"
MINGRU_FORMULA = "mingru-v1"
MINLSTM_FORMULA = "minlstm-v1"
DECODE_SUFFIX = "-decode"  # inserted before the version: attention-decode-v1, lstm-block-decode-v1, …

# Backward / forward FLOP ratios.
# The attention core's backward is 5 matmuls against the forward's 2 (QKᵀ recomputed, then dV, dP, dQ, dK), so
# 2.5× the forward: the convention of FlashAttention's benchmarks (Dao 2023, FlashAttention-2 §4.1;
# Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, ``flops``). Kept as a fraction so counts
# stay exact integers (4·… × 5/2 is always whole).
_CORE_BACKWARD = (5, 2)
# A matmul Y = X·W needs dX = dY·Wᵀ and dW = Xᵀ·dY in backward: twice its forward (Kaplan et al. 2020, §2.1).
_MATMUL_BACKWARD = 2
# Matmuls per cell step: LSTM has 4 gates (i, f, g, o), GRU 3 (r, z, n); each is an (I+H)→H product. minGRU
# has 2 (z, h̃) and minLSTM 3 (f, i, h̃), each an I→H product of x_t alone (Feng et al. 2024, §3): no H→H term.
GATES = {"lstm": 4, "gru": 3, "mingru": 2, "minlstm": 3}
_RNN_FORMULAS = {"lstm": LSTM_FORMULA, "gru": GRU_FORMULA, "mingru": MINGRU_FORMULA, "minlstm": MINLSTM_FORMULA}


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


# Attention cores that compute QKᵀ and P·V for every (query, key) pair whatever the causal mask: the explicit
# formula, and torch's math backend (which builds the mask and applies it to the full score matrix).
FULL_SCORE_MODELS = frozenset({"vanilla", "sdpa-math"})


def scores_in_full(case: Case, sdpa_kernel: str | None = None) -> bool:
    """Whether ``case``'s core computes all n² scores though its mask keeps fewer: a causal case on a
    ``FULL_SCORE_MODELS`` core, or ``sdpa`` whose dispatch chose the math backend (``sdpa_kernel`` "MATH")."""
    full = case.model in FULL_SCORE_MODELS or (case.model == "sdpa" and sdpa_kernel == "MATH")
    return case.family == "attention" and case.causal and full


def count_flops(case: Case, *, full_scores: bool = False) -> FlopCount:
    """Analytic FLOPs of one ``case.mode`` call of ``case`` (a multiply-add counts 2). See the module notes.

    ``full_scores`` counts every (query, key) pair of the core, masked or not: the work executed by a core that
    masks after computing (``scores_in_full``), rather than the useful work the mask keeps."""
    formula = formula_id(case)
    forward, backward = _attention(case, full_scores) if case.family == "attention" else _recurrent(case)
    # forward and decode count the forward pass, backward the backward pass alone, train both.
    detail = dict(forward) if case.mode != "backward" else {}
    if case.mode in ("train", "backward"):
        detail.update({f"{name}_backward": flops for name, flops in backward.items()})
    return FlopCount(flops=sum(detail.values()), formula=formula, detail=MappingProxyType(detail))


def formula_id(case: Case) -> str:
    """The id of the formula ``count_flops`` uses for ``case``: family (or cell), scope and decode, versioned."""
    scope = str(case.option("scope"))
    if case.family == "attention":
        formula = {"core": ATTENTION_FORMULA, "block": ATTENTION_BLOCK_FORMULA, "model": TRANSFORMER_FORMULA}[scope]
    elif case.model not in GATES:
        raise ValueError(f"no FLOP formula for recurrent model {case.model!r}; known: {', '.join(GATES)}")
    else:
        formula = _RNN_FORMULAS[case.model] if scope == "core" else f"{case.model}-{scope}-v1"
    if case.mode == "decode":
        stem, version = formula.rsplit("-", 1)
        formula = f"{stem}{DECODE_SUFFIX}-{version}"
    return formula


def causal_pairs(q_len: int, k_len: int) -> int:
    """How many (query, key) pairs a causal mask keeps: Σ_{i<q_len} min(i+1, k_len).

    Top-left aligned, as torch's ``is_causal=True`` is: query i sees keys 0..i, whatever ``k_len``. Closed
    form of the sum: a triangle for the first min(q_len, k_len) rows, then full rows of ``k_len``.
    """
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be ≥ 0, got q_len={q_len}, k_len={k_len}")
    rows = min(q_len, k_len)
    return rows * (rows + 1) // 2 + (q_len - rows) * k_len


def executed_flops(case: Case, sdpa_kernel: str | None = None) -> int:
    """FLOPs one call executes: ``count_flops`` with the full score matrix where the core computes it all."""
    return count_flops(case, full_scores=scores_in_full(case, sdpa_kernel)).flops


def _attention(case: Case, full_scores: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """Forward and backward parts of ``case.layers`` attention layers or pre-norm blocks (attnbench.measure.models)."""
    if case.heads is None or case.heads <= 0 or case.d_model % case.heads:
        raise ValueError(f"attention case needs heads dividing d_model={case.d_model}, got heads={case.heads}")
    b, d = case.batch, case.d_model
    # Tokens the matmuls see per sequence: all S, or the one new token of a decode step.
    s = 1 if case.mode == "decode" else case.seq_len
    # Projections: the fused qkv Linear(d, 3d) and the out Linear(d, d) are 4·d² weights applied to B·S tokens,
    # 2 FLOPs each (issue 3: 2·B·S·d_model²·4). Bias adds are not counted.
    projections = 2 * b * s * d * d * 4
    # Core: QKᵀ and P·V each take D multiply-adds per kept (query, key) pair and head: 2·2·B·H·D per pair,
    # i.e. 4·B·H·Sq·Sk·D unmasked (FlashAttention's benchmark count). Causal counts the pairs the mask keeps
    # exactly, where FlashAttention's benchmark halves: S(S+1)/2, not S²/2, which matters at short lengths (and
    # causal_pairs handles Sq ≠ Sk). Self-attention here: Sq = Sk = S and H·D = d_model. A decode step has one
    # query against the n cached keys and its own: n + 1 pairs, 4·B·H·(n + 1)·D (the KV-cache read), unmasked.
    if case.mode == "decode":
        pairs = case.seq_len + 1
    else:
        pairs = causal_pairs(s, s) if case.causal and not full_scores else s * s
    core = 4 * b * d * pairs
    numerator, denominator = _CORE_BACKWARD
    forward = {"projections": case.layers * projections, "core": case.layers * core}
    if case.option("scope") != "core":
        # The block's FFN: Linear(d, m·d) then Linear(m·d, d), 2·m·d² weights per token (Vaswani et al. 2017
        # §3.3; BERT-base m = 4). The embedding lookup and positional encodings do no matmul.
        forward["ffn"] = case.layers * 2 * b * s * 2 * int(case.option("ffn_mult")) * d * d
    backward = {
        name: flops * numerator // denominator if name == "core" else _MATMUL_BACKWARD * flops
        for name, flops in forward.items()
    }
    return forward, backward


def _recurrent(case: Case) -> tuple[dict[str, int], dict[str, int]]:
    """Forward and backward of a recurrent stack (core) or of recurrent blocks, as ``measure.models`` builds it.
    A decode step is the same count for one token per sequence (``case.tokens``): the cell's work per step does
    not depend on how many came before."""
    cell, d, tokens = case.model, case.d_model, case.tokens
    directions = _directions(case)
    hidden = recurrent_hidden(case)
    gates = projection = 0
    for layer in range(case.layers):
        # At scope core the stack's later layers take the previous layer's output; a block's layer takes d.
        inputs = d if layer == 0 or case.option("scope") != "core" else hidden * directions
        if cell in ("lstm", "gru"):
            # Per step and direction each gate is an (I+H)→H matmul: 2·gates·B·T·H·(I+H) in all, i.e.
            # LSTM 8·B·T·H·(I+H), GRU 6·B·T·H·(I+H) (issue 3). Element-wise gate math is not counted.
            gates += directions * 2 * GATES[cell] * tokens * hidden * (inputs + hidden)
        else:
            # minGRU/minLSTM: one I→gates·H Linear over the whole sequence; the scan is element-wise.
            gates += 2 * GATES[cell] * tokens * inputs * hidden
        if case.option("scope") != "core" and directions * hidden != d:
            projection += 2 * tokens * directions * hidden * d  # the block's Linear back to d_model
    forward = {"gates": gates} | ({"projection": projection} if projection else {})
    # Backward ≈ 2× forward (both dX/dh and dW per matmul). Exactly, autograd skips dh₀ at the first step
    # (h₀ = 0 needs no gradient): one step's hidden matmuls per layer and direction, a 1/T-sized difference.
    return forward, {name: _MATMUL_BACKWARD * flops for name, flops in forward.items()}


# ---------------------------------------------------------------------------------------------------- sizes
def _directions(case: Case) -> int:
    if case.model in ("lstm", "gru") and bool(case.option("bidirectional")):
        if case.d_model % 2:
            raise ValueError(f"bidirectional {case.model} needs an even d_model, got {case.d_model}")
        return 2
    return 1


def attention_block_parameters(d_model: int, ffn_mult: int) -> int:
    """Parameters of one pre-norm Transformer block: 2 LayerNorms, QKV + output projections, the FFN."""
    d, m = d_model, ffn_mult
    norms = 2 * 2 * d
    attention = (3 * d * d + 3 * d) + (d * d + d)
    ffn = (d * m * d + m * d) + (m * d * d + d)
    return norms + attention + ffn


def cell_parameters(cell: str, inputs: int, hidden: int) -> int:
    """Parameters of one recurrent layer, one direction, as torch / attnbench.measure.models.minrnn lay them out."""
    gates = GATES[cell]
    if cell in ("lstm", "gru"):
        return gates * (inputs * hidden + hidden * hidden + 2 * hidden)  # W_ih, W_hh, b_ih, b_hh
    return gates * (inputs * hidden + hidden)  # one Linear(I, gates·H); no H→H weights at all


def recurrent_block_parameters(cell: str, d_model: int, hidden: int, directions: int = 1) -> int:
    """LayerNorm, the recurrent layer (``directions`` × ``hidden`` wide), a Linear back to d_model if needed."""
    width = directions * hidden
    projection = width * d_model + d_model if width != d_model else 0
    return 2 * d_model + directions * cell_parameters(cell, d_model, hidden) + projection


# cuBLAS and cuDNN take their tensor-core paths when a matrix dimension is a multiple of 8 (16-bit types), so a
# matched width is rounded to one wherever that stays within MATCH_TOLERANCE: a width of 934 would time the
# LSTM on a slow path its authors would never have chosen.
_ALIGN = 8


@lru_cache(maxsize=256)
def matched_hidden(cell: str, d_model: int, directions: int, ffn_mult: int) -> int:
    """The hidden width (per direction) whose recurrent block is closest in size to the attention block,
    preferring a multiple of 8 within ``MATCH_TOLERANCE`` of it.

    With the projection the block grows strictly with the width, so a bisection finds where it crosses the
    target; the width that needs no projection (directions × hidden = d_model) is a candidate of its own.
    """
    if cell not in GATES:
        raise ValueError(f"no sizes for recurrent model {cell!r}; known: {', '.join(GATES)}")
    target = attention_block_parameters(d_model, ffn_mult)

    def projected(hidden: int) -> int:
        width = directions * hidden
        return 2 * d_model + directions * cell_parameters(cell, d_model, hidden) + width * d_model + d_model

    def error(hidden: int) -> float:
        return abs(recurrent_block_parameters(cell, d_model, hidden, directions) - target) / target

    low, high = 1, 1
    while projected(high) < target:
        high *= 2
    while low < high:  # the least hidden with projected(hidden) >= target
        mid = (low + high) // 2
        low, high = (mid + 1, high) if projected(mid) < target else (low, mid)
    aligned = {max(_ALIGN, low // _ALIGN * _ALIGN), (low + _ALIGN - 1) // _ALIGN * _ALIGN}
    candidates = {max(1, low - 1), low} | aligned | ({d_model // directions} if d_model % directions == 0 else set())
    best = min(candidates, key=lambda h: (error(h), h))
    fitting = [h for h in candidates if h % _ALIGN == 0 and error(h) <= MATCH_TOLERANCE]
    return min(fitting, key=lambda h: (error(h), h)) if fitting else best


def match_error(cell: str, d_model: int, directions: int, ffn_mult: int) -> float:
    """How far (relative) the matched recurrent block is from the attention block's parameter count."""
    target = attention_block_parameters(d_model, ffn_mult)
    got = recurrent_block_parameters(cell, d_model, matched_hidden(cell, d_model, directions, ffn_mult), directions)
    return abs(got - target) / target


def recurrent_hidden(case: Case) -> int:
    """The hidden width per direction of ``case``'s recurrent layers.

    d_model (split over the directions) at scope core and with ``match: hidden``; with ``match: params`` the
    width that makes each block the size of the attention block of the same d_model and ffn_mult. Raises
    ValueError where no width gets within ``MATCH_TOLERANCE`` (tiny d_model: the sizes move in coarse steps).
    """
    directions = _directions(case)
    if case.option("scope") == "core" or case.option("match") == "hidden":
        return case.d_model // directions
    ffn_mult = int(case.option("ffn_mult"))
    error = match_error(case.model, case.d_model, directions, ffn_mult)
    if error > MATCH_TOLERANCE:
        raise ValueError(
            f"{case.model} at d_model {case.d_model}: no hidden width gets a block within "
            f"{MATCH_TOLERANCE:.0%} of the attention block's parameters (best is {error:.1%} off)"
        )
    return matched_hidden(case.model, case.d_model, directions, ffn_mult)


def positions(case: Case) -> int:
    """Rows of the learned position table: ``max_len``, or where that is 0 the positions the case covers (its
    seq_len; for decode the context and the new token, n + 1)."""
    return int(case.option("max_len")) or case.span


def count_parameters(case: Case) -> int:
    """The parameter count of ``case``'s model as attnbench.measure.models builds it (a test holds them equal)."""
    d, scope = case.d_model, case.option("scope")
    if case.family == "attention":
        per_layer = (
            4 * d * d + 4 * d if scope == "core" else attention_block_parameters(d, int(case.option("ffn_mult")))
        )
        body = case.layers * per_layer
    else:
        directions, hidden = _directions(case), recurrent_hidden(case)
        if scope != "core":
            body = case.layers * recurrent_block_parameters(case.model, d, hidden, directions)
        else:
            body = sum(
                directions * cell_parameters(case.model, d if layer == 0 else directions * hidden, hidden)
                for layer in range(case.layers)
            )
    embedding = int(case.option("vocab")) * d + 2 * d if scope == "model" else 0  # and the final LayerNorm
    table = positions(case) * d if case.option("positional") == "learned" else 0
    return body + embedding + table
