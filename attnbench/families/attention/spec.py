"""Softmax self-attention with interchangeable cores (the explicit formula, SDPA's backends, flash-attn, flex),
torch-free: names, options, sizes, FLOPs, decode state. The torch half is ``attnbench.families.attention.layers``.

FLOPs: QKᵀ and P·V each take D multiply-adds per kept (query, key) pair and head: 2·2·B·H·D per pair, i.e.
4·B·H·Sq·Sk·D unmasked (FlashAttention's benchmark count). Causal counts the pairs the mask keeps exactly, where
FlashAttention's benchmark halves: S(S+1)/2, not S²/2, which matters at short lengths. A decode step has one query
against the n cached keys and its own: n + 1 pairs, unmasked (the KV-cache read). GQA changes neither: every
query head still scores every key it sees. A window of W keeps the band's pairs, and a decode step min(n + 1, W)
keys, the ring buffer's. The core's backward is 5 matmuls against the forward's 2 (QKᵀ recomputed, then dV, dP,
dQ, dK), so 2.5× the forward: the convention of FlashAttention's benchmarks (Dao 2023, FlashAttention-2 §4.1;
Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py, ``flops``).

Sinks (``sinks``, gpt-oss's learned per-head logit in the softmax's denominator) add one score per query and head,
no product: the counts are those without (formula ids gain ``-sinks``); H parameters per layer; no decode state.

Decode state: K and V of every position in every layer, 2 × layers × batch × (n + 1) × H_kv·head_dim × the dtype's
bytes (the n context positions and the slot the new token's K and V are written into); a window of W keeps a ring
of min(n + 1, W) slots, so its cache stops growing at n = W. Bookkeeping the kernels need beside it (flash-attn's
int32 ``cache_seqlens``: 4 bytes per sequence) is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnbench.core.cases import Case, Options, OptionValue
from attnbench.families import shared
from attnbench.families.base import (
    ClaimRole,
    ExtraSpec,
    ExtraValue,
    Family,
    ModelSpec,
    OptionSpec,
    Package,
    Parts,
    Preset,
    Problem,
    ValueOf,
)

# A windowed SDPA core attends block by block (``band_blocks``): SDPA has no band of its own, and one call over the
# whole sequence with the band as its mask computes all n² scores, since a mask skips no tile. BAND_BLOCK queries (W,
# where the window is wider) against the keys their band reaches are one fused call each: n·(block + W − 1) scores at
# most, the band's own work plus a block's triangle, as flash-attn's ``window_size`` skips the tiles outside the band.
BAND_BLOCK = 256


def band_blocks(length: int, window: int, *, causal: bool) -> tuple[tuple[int, int, int, int], ...]:
    """(first query, end, first key, end) of each block of a windowed SDPA core's call over ``length`` positions, or
    () where one masked call does no more work: no window, or a sequence of at most two blocks."""
    block = max(window, BAND_BLOCK)
    if not window or length <= 2 * block:
        return ()
    spans = []
    for start in range(0, length, block):
        end = min(start + block, length)
        spans.append((start, end, max(0, start - window + 1), end if causal else min(length, end + window - 1)))
    return tuple(spans)


_OPTIONS = (
    shared.SCOPE,
    shared.FFN_MULT,
    shared.VOCAB,
    shared.positional(rope=True),
    shared.MAX_LEN,
    shared.preset("bert-base"),
    shared.HEADS_KV,
    shared.WINDOW,
    OptionSpec(
        "head_dim",
        int,
        0,
        "D: features per head; 0 = d_model / heads (published models decouple them: gpt-oss-20b has 64 heads of 64 "
        "on d_model 2880)",
        minimum=0,
        maximum=4096,
    ),
    OptionSpec("bias", bool, True, "biases on the input and output projections (BERT: yes; Llama: no)"),
    OptionSpec(
        "output_gate",
        bool,
        False,
        "gated attention: the core's output times sigmoid of a gate projected from the input, H·D wide "
        "(Qwen3-Next's full-attention layers)",
    ),
    OptionSpec("qk_norm", bool, False, "RMSNorm (a weight of D) on every head's query and key (Qwen3, Qwen3-Next)"),
    OptionSpec(
        "sinks",
        bool,
        False,
        "a learned sink logit per head in every softmax's denominator (gpt-oss's attention sinks; with or without a "
        "window); vanilla and the SDPA cores",
    ),
    shared.COMPILE,
)
# Cores that take no sinks: flash-attn's kernel has no sink logit, flex's score_mod no denominator term.
_NO_SINKS = frozenset({"flash-attn", "flex"})
SINKS_SUFFIX = "-sinks"
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
            decodes=False,
        ),
    )
    extras = (
        ExtraSpec(
            "sdpa_kernel",
            str,
            "",
            "the SDPA backend PyTorch's dispatch chose for model sdpa (FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH, "
            "CUDNN_ATTENTION), asked with the case's own shapes",
            column=True,
        ),
        shared.GQA_PATH,
        ExtraSpec(
            "math_sdp_reduced_precision",
            bool,
            "",
            "16-bit SDPA rows: whether SDPA's math path computed in the row's dtype (true) or upcast to float32",
        ),
    )

    packages = (Package("flash-attn", "flash_attn"),)
    case_columns = (shared.HEADS_KV_COLUMN, shared.WINDOW_COLUMN)
    state_noun = "KV cache"
    preset_core = "sdpa"  # bert-base on PyTorch's own dispatch, unless presets.core names another core

    def window(self, case: Case) -> int:
        """The sliding window's width in positions, or 0 for attention over the whole sequence."""
        return int(self.option(case, "window"))

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return shared.network_no_effect(name, value_of, recurrent=False)

    def no_effect_up_to(self, model: str, name: str, value: OptionValue, longest: int) -> Problem | None:
        """A window as long as every sequence of the grid changes nothing (the band keeps every pair)."""
        if name != "window" or not value or int(value) < longest:
            return None
        return Problem(
            f"window {value} covers every seq_len (the longest is {longest}), so it changes nothing",
            name,
            f"give a window below {longest}, or remove window (0 = the whole sequence)",
        )

    def cannot_build(self, case: Case) -> Problem | None:
        opt = self.values(case)
        if case.model in _NO_SINKS and self.option(case, "sinks"):
            return Problem(
                f"{case.model} takes no attention sinks (its kernel has no extra logit in the softmax's denominator)",
                "sinks",
                "use sinks with vanilla or an SDPA core (sdpa-flash, sdpa-math, sdpa)",
            )
        heads = case.heads or 0
        if heads and case.d_model % heads and not int(opt("head_dim")):
            return Problem(
                f"heads {heads} does not divide d_model {case.d_model}: each head gets d_model / heads",
                "head_dim",
                "choose heads that divide d_model, or set head_dim",
            )
        return shared.heads_cannot_build(case, opt) or shared.network_cannot_build(case, opt)

    def serving_problem(self, case: Case) -> Problem | None:
        """flex compiles for exact shapes, which every serving question varies; a window's ring of W slots holds
        neither what a rollback restores nor the keys a chunk of queries straddling it would need."""
        if case.model == "flex":
            return Problem(
                "flex compiles its kernel for each exact shape (dynamic=False), and the serving questions run many "
                "(a capacity search's batches, a cache that grows chunk by chunk, packed lengths)",
                hint="ask them of an SDPA core (sdpa-flash, sdpa) or of vanilla",
            )
        window = self.window(case)
        if window and case.mode == "verify":
            return Problem(
                f"a window's ring cache keeps the last {window} positions, so a rollback would need slots the draft "
                "tokens overwrote",
                hint="verify attention over the whole sequence (window 0)",
            )
        if window and case.mode == "prefix":
            return Problem(
                f"a window's ring cache keeps the last {window} positions, so the requests' own tokens overwrite the "
                "prefix's slots: they cannot be shared by reference",
                hint="share prefixes of attention over the whole sequence (window 0)",
            )
        chunk = case.param("prefill_chunk")
        if window and case.mode == "prefill" and 0 < chunk < case.seq_len:
            return Problem(
                f"a window's ring cache keeps the last {window} positions; a chunk attending to it is not implemented",
                hint="prefill a windowed model in one pass (prefill_chunk 0)",
            )
        return super().serving_problem(case)

    def canonical(self, spec: ModelSpec, options: Options, heads: int) -> Options:
        return shared.without_full_heads_kv(options, heads)

    def kv_heads(self, case: Case) -> int:
        """Key/value heads: ``heads`` for multi-head attention, fewer for GQA, 1 for MQA."""
        return shared.kv_heads(case, self.values(case))

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        return {"heads_kv": shared.kv_heads(case, self.values(case)), "window": self.window(case)}

    def claim_role(self, case: Case) -> ClaimRole | None:
        # A band of W keys changes the complexity the article's claims state (O(n·W), a cache that stops growing).
        return None if self.window(case) else ClaimRole("attention")

    def state_written(self, case: Case, state_bytes: int) -> int:
        """A step writes the new token's K and V: one slot of the cache (``span`` slots, or ``window``)."""
        slots = min(case.span, self.window(case)) if self.window(case) else case.span
        return state_bytes // max(slots, 1)

    def prefill_carries(self, case: Case) -> bool:
        return False  # the context attends to all of itself: one pass fills the cache

    def formula(self, case: Case) -> str:
        opt = self.values(case)
        stem = shared.scope_stem(opt, "attention", model="transformer-model")
        return shared.versioned(
            stem,
            shared.GQA_SUFFIX * (shared.kv_heads(case, opt) != case.heads),
            shared.WINDOW_SUFFIX * bool(self.window(case)),
            SINKS_SUFFIX * bool(self.option(case, "sinks")),
            shared.DECODE_SUFFIX * (case.mode == "decode"),
        )

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        opt = self.values(case)
        if case.heads is None or case.heads <= 0 or (case.d_model % case.heads and not int(opt("head_dim"))):
            raise ValueError(f"attention case needs heads dividing d_model={case.d_model}, got heads={case.heads}")
        s, window = shared.call_tokens(case), self.window(case)
        if case.mode == "decode":
            pairs = min(case.span, window) if window else case.span
        elif full_scores:
            blocks = band_blocks(s, window, causal=case.causal) if case.model.startswith("sdpa") else ()
            pairs = sum((end - start) * (last - first) for start, end, first, last in blocks) if blocks else s * s
        elif window:
            pairs = shared.window_pairs(s, window, causal=case.causal)
        else:
            pairs = shared.causal_pairs(s, s) if case.causal else s * s
        core = 4 * case.batch * shared.q_width(case, opt) * pairs  # H·D per pair: d_model unless head_dim is set
        return shared.attention_like_work(case, opt, core, _CORE_BACKWARD)

    def scores_in_full(self, case: Case, extra: Mapping[str, object]) -> bool:
        """A causal case on a ``FULL_SCORE_MODELS`` core, or ``sdpa`` whose dispatch chose the math backend (its row's
        ``sdpa_kernel``); a window on any SDPA model too (its band is an explicit mask, applied to every tile of the
        sequence or of each ``band_blocks`` block, which ``work`` then counts). Never a decode step."""
        window = self.window(case)
        if case.mode == "decode" or not (case.causal or window):
            return False
        full = case.model in FULL_SCORE_MODELS or (case.model == "sdpa" and extra.get("sdpa_kernel") == "MATH")
        return full or (bool(window) and case.model.startswith("sdpa"))

    def parameters(self, case: Case) -> int:
        opt = self.values(case)
        sinks = (case.heads or 0) if self.option(case, "sinks") else 0  # one logit per head and layer
        return shared.network_parameters(
            case, opt, case.layers * (shared.attention_layer_parameters(case, opt) + sinks)
        )

    def state_bytes(self, case: Case) -> int:
        window = self.window(case)
        slots = min(case.span, window) if window else case.span
        width = shared.kv_width(case, self.values(case))
        kept = case.kept_dtype("kv_dtype") or case.dtype  # int8 adds a float32 scale per layer, K or V, and head
        scales = 2 * case.layers * shared.kv_heads(case, self.values(case)) * 4 if kept == "int8" else 0
        pages = -(-slots // case.page_tokens) if case.page_tokens else 0  # whole pages, and an int64 id each
        slots, table = (pages * case.page_tokens, case.layers * case.batch * pages * 8) if pages else (slots, 0)
        return 2 * case.layers * case.batch * slots * width * shared.DTYPE_BYTES[kept] + scales + table

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"

    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        return shared.embedding_table(case, self.values(case))

    def intermediate_elements(self, case: Case) -> int:
        return shared.attention_like_intermediates(case, self.values(case))


FAMILY = AttentionFamily()
