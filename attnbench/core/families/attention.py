"""Softmax self-attention with interchangeable cores (the explicit formula, SDPA's backends, flash-attn, flex),
torch-free: names, options, sizes, FLOPs, decode state. The torch half is ``attnbench.measure.models.attention``.

FLOPs: QKᵀ and P·V each take D multiply-adds per kept (query, key) pair and head: 2·2·B·H·D per pair, i.e.
4·B·H·Sq·Sk·D unmasked (FlashAttention's benchmark count). Causal counts the pairs the mask keeps exactly, where
FlashAttention's benchmark halves: S(S+1)/2, not S²/2, which matters at short lengths. A decode step has one query
against the n cached keys and its own: n + 1 pairs, unmasked (the KV-cache read). GQA changes neither: every
query head still scores every key it sees. A window of W keeps the band's pairs, and a decode step min(n + 1, W)
keys, the ring buffer's. The core's backward is 5 matmuls against the forward's 2 (QKᵀ recomputed, then dV, dP,
dQ, dK), so 2.5× the forward: the convention of FlashAttention's benchmarks (Dao 2023, FlashAttention-2 §4.1;
Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, ``flops``).

Decode state: K and V of every position in every layer, 2 × layers × batch × (n + 1) × H_kv·head_dim × the dtype's
bytes (the n context positions and the slot the new token's K and V are written into); a window of W keeps a ring
of min(n + 1, W) slots, so its cache stops growing at n = W. Bookkeeping the kernels need beside it (flash-attn's
int32 ``cache_seqlens``: 4 bytes per sequence) is not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.core.families import shared
from attnbench.core.families.base import ExtraSpec, Family, ModelSpec, Parts, Preset, Problem, ValueOf

if TYPE_CHECKING:
    from attnbench.core.cases import Case

_OPTIONS = (
    shared.SCOPE,
    shared.FFN_MULT,
    shared.VOCAB,
    shared.positional(rope=True),
    shared.MAX_LEN,
    shared.preset("bert-base"),
    shared.HEADS_KV,
    shared.WINDOW,
    shared.COMPILE,
)
# name, summary, devices, package
_MODELS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("vanilla", "explicit QKᵀ/√d → softmax → ·V; materialises the n×n score matrix per head", ("cpu", "cuda"), None),
    ("sdpa-math", "F.scaled_dot_product_attention forced to the MATH backend", ("cpu", "cuda"), None),
    ("sdpa-flash", "F.scaled_dot_product_attention forced to FLASH_ATTENTION", ("cpu", "cuda"), None),
    (
        "sdpa-efficient",
        "F.scaled_dot_product_attention forced to EFFICIENT_ATTENTION (memory-efficient, xFormers-style)",
        ("cuda",),
        None,
    ),
    ("sdpa-cudnn", "F.scaled_dot_product_attention forced to CUDNN_ATTENTION", ("cuda",), None),
    (
        "sdpa",
        "F.scaled_dot_product_attention with PyTorch's own dispatch (the kernel chosen is recorded)",
        ("cpu", "cuda"),
        None,
    ),
    ("flash-attn", "flash_attn.flash_attn_func from the Dao-AILab package", ("cuda",), "flash_attn"),
    (
        "flex",
        "torch.nn.attention.flex_attention, compiled; causal, window and GQA as block masks (inference only on CPU)",
        ("cpu", "cuda"),
        None,
    ),
)
# Cores that compute QKᵀ and P·V for every (query, key) pair whatever the causal mask: the explicit formula, and
# torch's math backend (which builds the mask and applies it to the full score matrix).
FULL_SCORE_MODELS = frozenset({"vanilla", "sdpa-math"})
_CORE_BACKWARD = (5, 2)  # kept as a fraction so counts stay exact integers (4·… × 5/2 is always whole)
_BERT_REFERENCE = (
    "Devlin et al. 2019 (arXiv:1810.04805) §3: L=12, H=768, A=12, 110M parameters; bert-base-uncased: "
    "vocab 30522, intermediate 3072, 512 positions"
)


class AttentionFamily(Family):
    name = "attention"
    order = 40
    models = tuple(
        ModelSpec(
            name, "attention", "attention", summary, devices=devices, package=package, options=_OPTIONS, heads=True
        )
        for name, summary, devices, package in _MODELS
    )
    presets = (
        Preset(
            "bert-base",
            "attention",
            "BERT-base encoder: 12 pre-norm blocks, d_model 768, 12 heads, FFN 3072, vocab 30522, 512 learned "
            "positions; no segment embeddings or pooler (108.9 M parameters)",
            None,
            768,
            12,
            12,
            (("max_len", 512), ("positional", "learned"), ("preset", "bert-base"), ("scope", "model")),
            max_seq_len=512,
            reference=_BERT_REFERENCE,
        ),
    )
    extras = (
        ExtraSpec(
            "sdpa_kernel",
            str,
            "",
            "the SDPA backend PyTorch's dispatch chose for model sdpa (FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH, "
            "CUDNN_ATTENTION), asked with the case's own shapes",
        ),
        shared.GQA_PATH,
        ExtraSpec(
            "math_sdp_reduced_precision",
            bool,
            "",
            "16-bit SDPA rows: whether SDPA's math path computed in the row's dtype (true) or upcast to float32",
        ),
    )

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return shared.network_no_effect(name, value_of, recurrent=False)

    def cannot_build(self, case: Case) -> Problem | None:
        return shared.heads_cannot_build(case) or shared.network_cannot_build(case)

    def formula(self, case: Case) -> str:
        stem = shared.scope_stem(case, "attention", model="transformer-model")
        return shared.versioned(
            stem,
            shared.GQA_SUFFIX * (case.heads_kv != case.heads),
            shared.WINDOW_SUFFIX * bool(case.window),
            shared.DECODE_SUFFIX * (case.mode == "decode"),
        )

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        if case.heads is None or case.heads <= 0 or case.d_model % case.heads:
            raise ValueError(f"attention case needs heads dividing d_model={case.d_model}, got heads={case.heads}")
        s = shared.call_tokens(case)
        if case.mode == "decode":
            pairs = min(case.span, case.window) if case.window else case.span
        elif full_scores:
            pairs = s * s
        elif case.window:
            pairs = shared.window_pairs(s, case.window, causal=case.causal)
        else:
            pairs = shared.causal_pairs(s, s) if case.causal else s * s
        return shared.attention_like_work(case, 4 * case.batch * case.d_model * pairs, _CORE_BACKWARD)

    def scores_in_full(self, case: Case, sdpa_kernel: str | None) -> bool:
        """A causal case on a ``FULL_SCORE_MODELS`` core, or ``sdpa`` whose dispatch chose the math backend; a window
        on any SDPA model too (its band is an explicit mask, applied to every tile). Never a decode step."""
        if case.mode == "decode" or not (case.causal or case.window):
            return False
        full = case.model in FULL_SCORE_MODELS or (case.model == "sdpa" and sdpa_kernel == "MATH")
        return full or (bool(case.window) and case.model.startswith("sdpa"))

    def parameters(self, case: Case) -> int:
        return shared.network_parameters(case, case.layers * shared.attention_layer_parameters(case))

    def state_bytes(self, case: Case) -> int:
        slots = min(case.span, case.window) if case.window else case.span
        return 2 * case.layers * case.batch * slots * shared.kv_width(case) * shared.DTYPE_BYTES[case.dtype]

    def takes_tokens(self, case: Case) -> bool:
        return case.option("scope") == "model"


FAMILY = AttentionFamily()
