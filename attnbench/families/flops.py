"""Analytic floating-point operation and parameter counts per case (issue 3, item 2; issue 7).

Pure Python: a report computes ``tflops`` and ``pct_of_peak`` from a stored row without torch. Every
count carries a ``formula`` id (family, scope and version) that goes into the row beside it, so a later change
of convention shows up as a new id rather than silently changing old numbers.

Each family states its own formulas, beside its options, in ``attnbench.families.<family>`` (its ``work``,
``formula``, ``parameters``); this module loops over them and never names a model. The same holds for the parameter
count of a case (``count_parameters``), which config validation and the presets use without torch (a test holds it
equal to the built module's). A model with no formula (a user's) has its FLOPs counted on the device instead, by
``torch.utils.flop_counter.FlopCounterMode`` over one call (formula ``counted-v1``), and a test holds every
built-in formula to that counter.

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
* ``verify`` is k draft tokens after n: the forward over n + k less the forward over n, the work of positions
  n…n+k−1, which a causal model's later positions do not change (attention's k queries over n + 1…n + k keys).
  Its ids end in ``-verify-v1``; the rollback after it is bookkeeping, not counted.
* FLOPs are *useful* work: a causal core is credited the (query, key) pairs its mask keeps. Cores that compute
  every pair and mask afterwards (``vanilla``; SDPA's math backend, forced or chosen by dispatch) execute the full
  n² as well: ``executed_flops`` counts that, and a row stores both (``flops``, ``executed_flops``). The fused
  kernels skip masked tiles, so for them the two agree (counted pair by pair, not tile by tile).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from attnbench.core.cases import Case
from attnbench.families.base import FlopCount
from attnbench.families.catalogue import family_of
from attnbench.families.shared import (
    COUNTED_FORMULA,
    DECODE_SUFFIX,
    GQA_SUFFIX,
    WINDOW_SUFFIX,
    attention_block_parameters,
    causal_pairs,
    kv_width,
    positions,
    window_pairs,
)

__all__ = [
    "COUNTED_FORMULA",
    "DECODE_SUFFIX",
    "GQA_SUFFIX",
    "WINDOW_SUFFIX",
    "FlopCount",
    "analytic",
    "attention_block_parameters",
    "causal_pairs",
    "count_flops",
    "count_parameters",
    "executed_flops",
    "formula_id",
    "kv_width",
    "positions",
    "scores_in_full",
    "window_pairs",
]


def analytic(case: Case) -> bool:
    """Whether ``case``'s FLOPs come from a formula (False: they are counted on the device)."""
    return family_of(case).analytic


def count_flops(case: Case, *, full_scores: bool = False) -> FlopCount:
    """Analytic FLOPs of one ``case.mode`` call of ``case`` (a multiply-add counts 2). See the module notes.

    ``full_scores`` counts every (query, key) pair of the core, masked or not: the work executed by a core that
    masks after computing (``scores_in_full``), rather than the useful work the mask keeps. NotImplementedError for
    a model with no formula."""
    if case.mode == "verify":
        return _verify_flops(case)
    family = family_of(case)
    forward, backward = family.work(case, full_scores)
    # forward and decode count the forward pass, backward the backward pass alone, train both.
    detail = dict(forward) if case.mode != "backward" else {}
    if case.mode in ("train", "backward"):
        detail.update({f"{name}_backward": flops for name, flops in backward.items()})
    return FlopCount(flops=sum(detail.values()), formula=family.formula(case), detail=MappingProxyType(detail))


def _verify_flops(case: Case) -> FlopCount:
    """A verify's k draft tokens after n (module notes): the forward over n + k less the forward over n. A verify
    runs on fused cores in chunks of k queries, so its executed work is the useful (the chunk's masked k²/2 pairs
    aside, small beside k·n)."""
    before = count_flops(replace(case, mode="forward", serving=()))
    after = count_flops(replace(case, mode="forward", serving=(), seq_len=case.span))
    detail = {name: flops - before.detail.get(name, 0) for name, flops in after.detail.items()}
    return FlopCount(flops=sum(detail.values()), formula=_verify_id(after.formula), detail=MappingProxyType(detail))


def _verify_id(forward: str) -> str:
    """A forward's formula id with ``-verify`` before its version: ``lstm-v1`` gives ``lstm-verify-v1``."""
    return re.sub(r"(-v\d+)$", r"-verify\1", forward)


def formula_id(case: Case) -> str:
    """The id of the formula ``count_flops`` uses for ``case``: family (or cell), scope, variant and decode,
    versioned (``attention-block-gqa-v1``, ``lstm-decode-v1``, ``counted-v1`` for a counted model)."""
    if case.mode == "verify":
        return _verify_id(family_of(case).formula(replace(case, mode="forward", serving=())))
    return family_of(case).formula(case)


def scores_in_full(case: Case, extra: Mapping[str, object] = MappingProxyType({})) -> bool:
    """Whether ``case``'s core computes all n² scores though its mask keeps fewer (``extra``: the row's, which say
    what ran, such as the backend dispatch chose: the family reads its own)."""
    return family_of(case).scores_in_full(case, extra)


def executed_flops(case: Case, extra: Mapping[str, object] = MappingProxyType({})) -> int:
    """FLOPs one call executes: ``count_flops`` with the full score matrix where the core computes it all."""
    return count_flops(case, full_scores=scores_in_full(case, extra)).flops


def count_parameters(case: Case) -> int | None:
    """The parameter count of ``case``'s model as attnbench.families.registry builds it (a test holds them equal);
    None for a model only its built module can count."""
    return family_of(case).parameters(case)
