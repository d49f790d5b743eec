"""What several families share, torch-free: the options of a network (scope, positions, embedding, FFN, compile,
GQA, windows) with their rules, and the counting every formula builds on.

Counting conventions (``attnbench.families.flops`` states them in full): a multiply-add counts 2 FLOPs; only matrix
products are counted; ``train`` is one forward plus one backward.
"""

from __future__ import annotations

from collections.abc import Callable

from attnbench.core.cases import DTYPE_BYTES as CASE_DTYPE_BYTES
from attnbench.core.cases import Case, Options
from attnbench.families.base import ExtraSpec, OptionSpec, Problem, ValueOf
from attnbench.families.published import PUBLISHED_NAMES

SCOPES: tuple[str, ...] = ("core", "block", "model")
POSITIONAL: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope")
COMPILE_MODES: tuple[str, ...] = ("none", "default", "reduce-overhead", "max-autotune")
# BERT's WordPiece vocabulary (Devlin et al. 2019; bert-base-uncased's vocab_size).
BERT_VOCAB = 30522
# Matched-parameter recurrent blocks land within this fraction of the attention block they stand in for.
MATCH_TOLERANCE = 0.01
DTYPE_BYTES = CASE_DTYPE_BYTES  # the dtypes a case computes or keeps in (core.cases)


def kept(case: Case, default: str) -> str:
    """A recurrent state's dtype (all its tensors): the case's ``state_dtype``, else ``default`` (the family's)."""
    return case.kept_dtype("state_dtype") or default


# A matmul Y = X·W needs dX = dY·Wᵀ and dW = Xᵀ·dY in backward: twice its forward (Kaplan et al. 2020, §2.1).
MATMUL_BACKWARD = 2
# Inserted before a formula's version: attention-gqa-v1, attention-block-window-v1, lstm-block-decode-v1, …
GQA_SUFFIX = "-gqa"
WINDOW_SUFFIX = "-window"
DECODE_SUFFIX = "-decode"
# The formula id of FLOPs counted on the device over one call (a model with no formula: a user's), not computed.
COUNTED_FORMULA = "counted-v1"

# ---------------------------------------------------------------------------------------------------- options
SCOPE = OptionSpec(
    "scope",
    str,
    "core",
    "core: the layer alone (projections + attention core, or the recurrent layer); block: a pre-norm block "
    "(LayerNorm, the layer, residual; attention adds the FFN); model: token embedding + positions + `layers` "
    "blocks + final LayerNorm, fed int64 token ids",
    choices=SCOPES,
)
FFN_MULT = OptionSpec(
    "ffn_mult",
    int,
    4,
    "FFN width as a multiple of d_model (BERT: 3072 = 4 x 768); for recurrent blocks with match: params, the "
    "attention block whose size is matched",
    minimum=1,
    maximum=64,
)
VOCAB = OptionSpec("vocab", int, BERT_VOCAB, "token embedding rows at scope model", minimum=2, maximum=4_194_304)
MAX_LEN = OptionSpec(
    "max_len",
    int,
    0,
    "positions the learned table covers; 0 = the case's seq_len (BERT-base: 512)",
    minimum=0,
    maximum=2**22,
)
PRESET_HELP = "set by the config's top-level presets key, never under model_options; recorded so a row names it"
MATCH = OptionSpec(
    "match",
    str,
    "hidden",
    "at scope block/model: hidden = d_model, or params: hidden chosen so a block has the parameters of the "
    "attention block of the same d_model and ffn_mult (within 1 %), with a Linear back to d_model",
    choices=("hidden", "params"),
)
COMPILE = OptionSpec(
    "compile",
    str,
    "none",
    "torch.compile the model with this mode before timing (none: eager); the compile wall time is recorded "
    "apart (compile_s) and a recompilation during timing is flagged",
    choices=COMPILE_MODES,
)
HEADS_KV = OptionSpec(
    "heads_kv",
    int,
    0,
    "key/value heads (grouped-query attention, Ainslie et al. 2023; 1 = multi-query, Shazeer 2019); must divide "
    "heads; 0 = heads (multi-head). The grid key heads_kv sets it for every model that has it",
    minimum=0,
    maximum=65_536,
    axis=True,
)
WINDOW = OptionSpec(
    "window",
    int,
    0,
    "sliding-window (local) attention: each query sees the last `window` positions (itself included; both "
    "sides when causal is false); 0 = the whole sequence. Decode keeps a ring buffer of `window` slots",
    minimum=0,
    maximum=2**22,
)
# summary.csv's columns for the cases of a family with key/value heads or windows (case_columns).
HEADS_KV_COLUMN = ExtraSpec(
    "heads_kv", int, "", "key/value heads: = heads for multi-head attention, fewer for GQA, 1 for MQA", column=True
)
WINDOW_COLUMN = ExtraSpec("window", int, "", "sliding-window width (0 = the whole sequence)", column=True)
GQA_PATH = ExtraSpec(
    "gqa_path",
    str,
    "",
    "how a core read fewer key/value heads than query heads: enable_gqa (SDPA, in place), native (flash-attn, flex), "
    "grouped (linear attention's torch forms: queries grouped per key/value head) or repeat (copied per query head "
    "first)",
)
_ROPE_REFUSED = (
    "rope",
    "positional rope rotates attention's queries and keys, and a recurrent model has none",
    "use sinusoidal or learned (added to the input), or none: a recurrence knows the order already",
)


def positional(*, rope: bool) -> OptionSpec:
    """The positional encoding; ``rope`` where the layer has queries and keys to rotate, else refused by name."""
    choices = POSITIONAL if rope else tuple(c for c in POSITIONAL if c != "rope")
    return OptionSpec(
        "positional",
        str,
        "none",
        "positional encoding: none, sinusoidal (Vaswani et al. 2017 §3.5) or learned (BERT) added to the "
        "input" + (", rope (rotary, Su et al. 2021) on queries and keys in every layer" if rope else ""),
        choices=choices,
        refused=() if rope else (_ROPE_REFUSED,),
    )


def preset(*names: str) -> OptionSpec:
    """The ``preset`` option: ``names`` (the family's own presets) and every published model's (a mixer of one is
    any family's model: ``families.published``)."""
    return OptionSpec("preset", str, "none", PRESET_HELP, choices=("none", *names, *PUBLISHED_NAMES))


# ---------------------------------------------------------------------------------------------------- rules
def network_no_effect(name: str, value_of: ValueOf, *, recurrent: bool) -> Problem | None:
    """The rules every network family shares: the parts an option sizes must exist."""
    scope = value_of("scope")
    if name == "vocab" and scope != "model":
        return Problem(
            "vocab sizes the token embedding, which exists at scope model only",
            name,
            "add scope: model, or remove vocab",
        )
    if name == "max_len" and value_of("positional") != "learned":
        return Problem(
            "max_len sizes the learned position table, which exists with positional: learned only",
            name,
            "add positional: learned, or remove max_len",
        )
    if name == "match" and scope == "core":
        return Problem(
            "match sizes the recurrent block; at scope core the layer has hidden = d_model",
            name,
            "add scope: block (or model), or remove match",
        )
    if name == "ffn_mult":
        if not recurrent and scope == "core":
            return Problem("ffn_mult sizes the FFN of a block; scope core has none", name, "add scope: block or model")
        if recurrent and (scope == "core" or value_of("match") != "params"):
            return Problem(
                "ffn_mult sizes the attention block a recurrent block matches, so needs match: params",
                name,
                "add scope: block (or model) with match: params, or remove ffn_mult",
            )
    return None


def network_cannot_build(case: Case, opt: ValueOf) -> Problem | None:
    """Learned positions must cover every position a call sees; rope rotates pairs of features."""
    kind = opt("positional")
    max_len = int(opt("max_len"))
    if kind == "learned" and 0 < max_len < case.span:
        if case.mode == "decode":
            return Problem(
                f"max_len {max_len} does not reach position {case.seq_len}: a decode step at n={case.seq_len} adds "
                "the token after the context, at position n",
                "max_len",
                f"raise max_len to at least {case.span}, or set 0 (= each case's n + 1)",
            )
        return Problem(
            f"max_len {max_len} is below seq_len {case.seq_len}: the learned table would not cover the sequence",
            "max_len",
            f"raise max_len to at least {case.seq_len}, or set 0 (= each case's seq_len)",
        )
    if kind == "rope" and case.heads is not None and head_dim(case, opt) % 2:
        width = head_dim(case, opt)
        given = f"head_dim {width}" if width != case.head_dim else f"{case.d_model} / {case.heads} = {width}"
        return Problem(
            f"rope rotates pairs of features, so head_dim = d_model / heads must be even; {given}",
            "positional",
            "choose heads so that d_model / heads is even",
        )
    return None


def heads_cannot_build(case: Case, opt: ValueOf) -> Problem | None:
    """Key/value heads must divide the query heads (each serves heads / heads_kv of them)."""
    heads, kv = case.heads or 0, int(opt("heads_kv"))
    if kv and (kv > heads or heads % kv):
        divisors = ", ".join(str(k) for k in range(1, heads + 1) if heads % k == 0)
        return Problem(
            f"heads_kv {kv} does not divide heads {heads}: each key/value head serves heads / heads_kv query "
            "heads, which must be whole",
            "heads_kv",
            f"heads_kv values that divide {heads}: {divisors} (1 = multi-query, {heads} = multi-head)",
        )
    return None


# ---------------------------------------------------------------------------------------------------- counting
def versioned(stem: str, *suffixes: str, version: int = 1) -> str:
    """``stem`` with its suffixes and version: ``attention-block`` + ``-window`` → ``attention-block-window-v1``."""
    return f"{stem}{''.join(suffixes)}-v{version}"


def scope_stem(opt: ValueOf, core: str, *, model: str | None = None) -> str:
    """The formula stem of a family at the case's scope: ``core`` at scope core, ``core-block`` for a block, and at
    scope model ``model`` where the family names its whole network apart (``transformer-model``)."""
    scope = str(opt("scope"))
    if scope == "core":
        return core
    if scope == "model" and model is not None:
        return model
    return f"{core}-{scope}"


def causal_pairs(q_len: int, k_len: int) -> int:
    """How many (query, key) pairs a causal mask keeps: Σ_{i<q_len} min(i+1, k_len).

    Top-left aligned, as torch's ``is_causal=True`` is: query i sees keys 0..i, whatever ``k_len``. Closed
    form of the sum: a triangle for the first min(q_len, k_len) rows, then full rows of ``k_len``.
    """
    if q_len < 0 or k_len < 0:
        raise ValueError(f"lengths must be ≥ 0, got q_len={q_len}, k_len={k_len}")
    rows = min(q_len, k_len)
    return rows * (rows + 1) // 2 + (q_len - rows) * k_len


def window_pairs(length: int, window: int, *, causal: bool) -> int:
    """How many (query, key) pairs a band of ``window`` keeps in self-attention over ``length`` positions: causal,
    query i sees keys i − W < j ≤ i, Σ_i min(i + 1, W); not causal, |i − j| < W, each side of the diagonal
    Σ_i min(i, W − 1) plus the diagonal itself."""
    if window <= 0 or window >= length:
        return causal_pairs(length, length) if causal else length * length
    causal_part = window * (window + 1) // 2 + (length - window) * window
    if causal:
        return causal_part
    return 2 * causal_part - length  # both triangles' bands, the diagonal counted once


def call_tokens(case: Case) -> int:
    """Tokens per sequence the matmuls of one call see: all of them, or the one new token of a decode step."""
    return 1 if case.mode == "decode" else case.seq_len


def without_full_heads_kv(options: Options, heads: int) -> Options:
    """``options`` without a heads_kv equal to ``heads``: that is multi-head attention, whose key says nothing."""
    if int(dict(options).get("heads_kv", 0)) != heads:
        return options
    return tuple(item for item in options if item[0] != "heads_kv")


def kv_heads(case: Case, opt: ValueOf) -> int:
    """Key/value heads: ``heads`` for multi-head attention, fewer for GQA, 1 for MQA (the heads_kv option, 0 =
    heads)."""
    return int(opt("heads_kv")) or (case.heads or 0)


def flag(opt: ValueOf, name: str, default: bool = False) -> bool:
    """An on/off option of an attention-like layer, ``default`` where the model has no such option (linear
    attention shares the layer without the attention family's head options)."""
    try:
        return bool(opt(name))
    except KeyError:
        return default


def head_dim(case: Case, opt: ValueOf) -> int:
    """D, the features of one head: the ``head_dim`` option where the model has it and sets it (published models
    such as gpt-oss-20b: 64 heads of 64 on a d_model of 2880), else d_model / heads."""
    if case.heads is None:
        raise ValueError(f"{case.model} has no heads")
    try:
        given = int(opt("head_dim"))
    except KeyError:
        given = 0
    return given or case.d_model // case.heads


def q_width(case: Case, opt: ValueOf) -> int:
    """Features of Q per token (and of the core's output): H·D, which is d_model unless ``head_dim`` is set."""
    return (case.heads or 0) * head_dim(case, opt)


def kv_width(case: Case, opt: ValueOf) -> int:
    """Features of K (and of V) per token: H_kv·D, which is d_model for multi-head attention."""
    if case.heads is None:
        raise ValueError(f"{case.model} has no key/value heads")
    return kv_heads(case, opt) * head_dim(case, opt)


def projected_width(case: Case, opt: ValueOf) -> int:
    """Width of the fused input projection: Q (H·D), the output gate (H·D, where ``output_gate``), K and V."""
    q = q_width(case, opt)
    return q * (1 + flag(opt, "output_gate")) + 2 * kv_width(case, opt)


def projection_flops(case: Case, opt: ValueOf) -> int:
    """One attention-like layer's projections per call: the fused Linear(d, H·D [+ H·D gate] + 2·H_kv·D) and the out
    Linear(H·D, d) applied to every token, 2 FLOPs per weight (issue 3: 2·B·S·d_model²·4 for multi-head attention,
    H·D = H_kv·D = d). Bias adds are not counted."""
    d = case.d_model
    return 2 * case.batch * call_tokens(case) * d * (projected_width(case, opt) + q_width(case, opt))


def ffn_flops(case: Case, opt: ValueOf) -> int:
    """One block's FFN per call: Linear(d, m·d) then Linear(m·d, d), 2·m·d² weights per token (Vaswani et al.
    2017 §3.3; BERT-base m = 4)."""
    d = case.d_model
    return 2 * case.batch * call_tokens(case) * 2 * int(opt("ffn_mult")) * d * d


def attention_block_parameters(d_model: int, ffn_mult: int, kv_width: int | None = None) -> int:
    """Parameters of one pre-norm Transformer block: 2 LayerNorms, QKV + output projections, the FFN. ``kv_width``
    is H_kv·D, the width of K and of V (d_model, its default, for multi-head attention)."""
    d, m = d_model, ffn_mult
    kv = d if kv_width is None else kv_width
    norms = 2 * 2 * d
    attention = (d * (d + 2 * kv) + d + 2 * kv) + (d * d + d)
    ffn = (d * m * d + m * d) + (m * d * d + d)
    return norms + attention + ffn


def attention_layer_parameters(case: Case, opt: ValueOf) -> int:
    """One attention-like layer (fused input and out projections, with biases unless ``bias`` is off; the output
    gate's rows where on; RMSNorm weights of D on queries and on keys where ``qk_norm``), or its pre-norm block
    (the block adds its two LayerNorms and the FFN)."""
    d, q, width = case.d_model, q_width(case, opt), projected_width(case, opt)
    bias = flag(opt, "bias", default=True)
    layer = d * width + q * d + bias * (width + d) + 2 * head_dim(case, opt) * flag(opt, "qk_norm")
    if opt("scope") != "core":
        m = int(opt("ffn_mult"))
        return layer + 2 * 2 * d + (d * m * d + m * d) + (m * d * d + d)
    return layer


def positions(case: Case, opt: ValueOf) -> int:
    """Rows of the learned position table: ``max_len``, or where that is 0 the positions the case covers (its
    seq_len; for decode the context and the new token, n + 1)."""
    return int(opt("max_len")) or case.span


def network_parameters(case: Case, opt: ValueOf, body: int) -> int:
    """``body`` plus what the network adds around it: at scope model the token embedding and the final
    LayerNorm, and the learned position table where there is one."""
    d = case.d_model
    embedding = int(opt("vocab")) * d + 2 * d if opt("scope") == "model" else 0
    table = positions(case, opt) * d if opt("positional") == "learned" else 0
    return body + embedding + table


def embedding_table(case: Case, opt: ValueOf) -> tuple[int, int] | None:
    """(rows, width) of the token embedding at scope model, which a call reads only at its tokens' rows; None
    elsewhere (``Family.lookup_table``)."""
    return (int(opt("vocab")), case.d_model) if opt("scope") == "model" else None


def network_interfaces(case: Case, opt: ValueOf) -> int:
    """Elements handed from one part of a network to the next through memory: from each of ``layers`` layers (or
    blocks) to the next and, at scope model, from the embedding to the first block and from the last block to the
    final LayerNorm (``Family.intermediate_elements``)."""
    parts = case.layers + (2 if opt("scope") == "model" else 0)
    return (parts - 1) * case.tokens * case.d_model


def attention_like_intermediates(case: Case, opt: ValueOf) -> int:
    """``Family.intermediate_elements`` of a stack of attention-like layers (projections around a core): per layer
    and token Q, K and V from the fused projection (d + 2·H_kv·D), which the core reads, and the core's output O (d),
    which the output projection reads: 8·d per token for multi-head attention's round trips (a fused kernel keeps
    the scores on chip, so none are counted). A block adds its two LayerNorms' outputs, h = x + attention (read
    by the second LayerNorm and the last residual) and the FFN's hidden layer (m·d), its activation fused into the
    first Linear."""
    d = case.d_model
    layer = projected_width(case, opt) + q_width(case, opt)
    if opt("scope") != "core":
        layer += 3 * d + int(opt("ffn_mult")) * d
    return case.layers * case.tokens * layer + network_interfaces(case, opt)


# cuBLAS and cuDNN take their tensor-core paths when a matrix dimension is a multiple of 8 (16-bit types), so a
# matched width is rounded to one wherever that stays within MATCH_TOLERANCE: a width of 934 would time the
# LSTM on a slow path its authors would never have chosen.
_ALIGN = 8


def matched_width(
    block: Callable[[int], int], projected: Callable[[int], int], target: int, natural: int | None
) -> int:
    """The width whose block (``block(width)`` parameters) is closest to ``target``, preferring a multiple of 8
    within ``MATCH_TOLERANCE`` of it.

    ``projected(width)`` is the block's size with its projection back to d_model, which grows strictly with the
    width, so a bisection finds where it crosses the target; ``natural``, the width that needs no projection, is a
    candidate of its own.
    """

    def error(width: int) -> float:
        return abs(block(width) - target) / target

    low, high = 1, 1
    while projected(high) < target:
        high *= 2
    while low < high:  # the least width with projected(width) >= target
        mid = (low + high) // 2
        low, high = (mid + 1, high) if projected(mid) < target else (low, mid)
    aligned = {max(_ALIGN, low // _ALIGN * _ALIGN), (low + _ALIGN - 1) // _ALIGN * _ALIGN}
    candidates = {max(1, low - 1), low} | aligned | ({natural} if natural is not None else set())
    best = min(candidates, key=lambda w: (error(w), w))
    fitting = [w for w in candidates if w % _ALIGN == 0 and error(w) <= MATCH_TOLERANCE]
    return min(fitting, key=lambda w: (error(w), w)) if fitting else best


def attention_like_work(
    case: Case, opt: ValueOf, core: int, core_backward: tuple[int, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Forward and backward parts of ``case.layers`` attention-like layers (or pre-norm blocks) whose core does
    ``core`` FLOPs per layer: the projections, the core, and the FFN of a block. The core's backward is
    ``core_backward`` (numerator, denominator) times its forward; every matmul's is ``MATMUL_BACKWARD``."""
    forward = {"projections": case.layers * projection_flops(case, opt), "core": case.layers * core}
    if opt("scope") != "core":
        forward["ffn"] = case.layers * ffn_flops(case, opt)  # the embedding lookup and positions do no matmul
    numerator, denominator = core_backward
    backward = {
        name: flops * numerator // denominator if name == "core" else MATMUL_BACKWARD * flops
        for name, flops in forward.items()
    }
    return forward, backward
