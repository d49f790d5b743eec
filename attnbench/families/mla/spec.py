"""Multi-head latent attention (MLA), torch-free: names, options, sizes, FLOPs, decode state. The torch half is
``attnbench.families.mla.layers``.

MLA (DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3, arXiv:2412.19437; Kimi Linear's full-attention
layers) compresses what a token leaves in the KV cache to a latent c_t = RMSNorm(W_DKV x_t) of ``kv_lora_rank`` d_c
channels and one rotary key k^R_t = RoPE(W_KR x_t) of ``qk_rope_head_dim`` d_R channels shared by the heads. Per head
h, with d_n = ``qk_nope_head_dim`` and d_v = ``v_head_dim``:

    k_{t,h} = [W_UK,h c_t ; k^R_t],   v_{t,h} = W_UV,h c_t,   q_{t,h} = [W_UQ,h c'_t ; RoPE(W_QR,h c'_t)]
    o_{t,h} = Σ_{s≤t} softmax_s(q_{t,h}·k_{s,h} / √(d_n + d_R)) v_{s,h},    y_t = W_O [o_{t,1}; …; o_{t,H}]

where c'_t = RMSNorm(W_DQ x_t) (``q_lora_rank`` d_q > 0) or x_t itself (``q_lora_rank`` 0: W_Q straight from d_model).
The up-projections W_UK, W_UV are one matrix (``kv_b``) of d_c → H·(d_n + d_v), as DeepSeek ships it.

Two forms of the same function (a test holds them equal, and to the per-head formula written out):

* ``naive``: expand every cached latent to per-head K and V (the kv_b product on every key), then attention: how
  DeepSeek's and vLLM's MLA run prefill.
* ``absorbed``: W_UK folded into the query (q̃_h = W_UKᵀ,h q^C_h, d_c wide) and W_UV into the output
  (o_h = W_UV,h õ_h): attention runs in the latent space, every head against the one cached latent (multi-query
  with head dim d_c + d_R and value dim d_c), and the kv_b product is never applied to the cache: how MLA decodes.

``form`` deployed (the default) is what serving engines do: naive over a whole sequence (and a prefill), absorbed for
a decode step; naive or absorbed use that form everywhere.

The cache per layer and token: d_c + d_R elements (the normed latent and the rotated shared key), in the model's
dtype: DeepSeek-V3's 512 + 64 = 576 against 2·128·128 = 32 768 for its 128 heads of multi-head attention.

Parameters of one layer (no biases, as DeepSeek's): the query side d·d_q + d_q + d_q·H·(d_n + d_R) (with q_lora_rank)
or d·H·(d_n + d_R); W_DKV and W_KR d·(d_c + d_R); the latent's norm d_c; kv_b d_c·H·(d_n + d_v); W_O H·d_v·d. A
block adds two LayerNorms and the FFN.

FLOPs (2 per multiply-add), per layer, B sequences, T query tokens, S keys, P kept (query, key) pairs per head:
- projections: 2·B·T·(query weights + d·(d_c + d_R) + H·d_v·d);
- naive: ``up`` 2·B·S·d_c·H·(d_n + d_v) (kv_b on every key, the whole cache in a naive decode step), ``core``
  2·B·H·P·(d_n + d_R) + 2·B·H·P·d_v;
- absorbed: ``up`` 2·B·T·H·d_n·d_c + 2·B·T·H·d_c·d_v (the two folded products, per query), ``core``
  2·B·H·P·(d_c + d_R) + 2·B·H·P·d_c;
- a block's FFN as attention's. Backward: every matmul twice; the core 5/2 of its forward (as attention).
P is S·(S+1)/2 causal over a whole sequence, S² not, and n + 1 for a decode step. The zeros SDPA's fused kernel is
fed (the narrower of q·k and v widths padded) are no product of the model's: not counted. Formula ids
``mla-<naive|absorbed>[-<scope>][-decode]-v1``.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import ClaimRole, Family, ModelSpec, OptionSpec, Parts, Problem, ValueOf

FORMS: tuple[str, ...] = ("deployed", "naive", "absorbed")
_CORE_BACKWARD = (5, 2)  # the attention core's backward, as the attention family counts it
_MAX_DIM = 65_536

_POSITIONAL = OptionSpec(
    "positional",
    str,
    "none",
    "positional encoding added to the input: none, sinusoidal or learned (MLA rotates its qk_rope_head_dim channels "
    "in every layer already)",
    choices=("none", "sinusoidal", "learned"),
    refused=(
        (
            "rope",
            "MLA rotates its decoupled qk_rope_head_dim channels of every query and of the shared key already",
            "leave positional at none: qk_rope_head_dim sizes MLA's rotary part",
        ),
    ),
)


def _dim(name: str, what: str, default: str) -> OptionSpec:
    return OptionSpec(name, int, 0, f"{what}; 0 = {default}", minimum=0, maximum=_MAX_DIM)


_OPTIONS = (
    OptionSpec(
        "form",
        str,
        "deployed",
        "deployed: naive over whole sequences and prefills, absorbed for a decode step (as serving engines run MLA); "
        "naive: K and V expanded from the latent per head; absorbed: W_UK and W_UV folded into the query and the "
        "output, attention in the latent space",
        choices=FORMS,
    ),
    _dim("kv_lora_rank", "d_c: the latent each token caches (DeepSeek-V3: 512)", "4 × d_model / heads"),
    OptionSpec(
        "q_lora_rank",
        int,
        0,
        "d_q: the query's low-rank bottleneck (DeepSeek-V3: 1536); 0 = none, W_Q straight from d_model",
        minimum=0,
        maximum=_MAX_DIM,
    ),
    _dim("qk_nope_head_dim", "d_n: per-head query/key channels without rotation (DeepSeek-V3: 128)", "d_model / heads"),
    _dim(
        "qk_rope_head_dim",
        "d_R: rotated channels, the key's shared by the heads (DeepSeek-V3: 64)",
        "d_model / heads / 2",
    ),
    _dim("v_head_dim", "d_v: per-head value width (DeepSeek-V3: 128)", "d_model / heads"),
    shared.SCOPE,
    shared.FFN_MULT,
    shared.VOCAB,
    _POSITIONAL,
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)


class MLAFamily(Family):
    name = "mla"
    order = 41
    models = (
        ModelSpec(
            "mla",
            "attention",
            "mla",
            "multi-head latent attention (DeepSeek-V2, arXiv:2405.04434; V3; Kimi Linear): a KV cache of one "
            "kv_lora_rank latent and a shared rotary key per token; decode with the up-projections absorbed",
            options=_OPTIONS,
            heads=True,
        ),
    )
    state_noun = "latent KV cache"
    # The form a whole sequence runs in changes nothing of a decode step's when form is deployed; a decode case keeps
    # form, as naive and absorbed steps differ.
    packages = ()  # plain torch: SDPA's dispatch and explicit products

    # ------------------------------------------------------------------------------------------------ sizes
    def dims(self, case: Case) -> tuple[int, int, int, int, int]:
        """(d_c, d_q, d_n, d_R, d_v) of ``case``, the defaults filled in."""
        head = case.d_model // (case.heads or 1)
        opt = self.values(case)
        return (
            int(opt("kv_lora_rank")) or 4 * head,
            int(opt("q_lora_rank")),
            int(opt("qk_nope_head_dim")) or head,
            int(opt("qk_rope_head_dim")) or max(2, head // 2 // 2 * 2),
            int(opt("v_head_dim")) or head,
        )

    def form(self, case: Case) -> str:
        """naive or absorbed: the form ``case``'s call runs in."""
        form = str(self.option(case, "form"))
        if form == "deployed":
            return "absorbed" if case.mode == "decode" else "naive"
        return form

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return shared.network_no_effect(name, value_of, recurrent=False)

    def cannot_build(self, case: Case) -> Problem | None:
        heads = case.heads or 0
        derived = [
            n
            for n in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            if not self.option(case, n)
        ]
        if derived and (not heads or case.d_model % heads):
            return Problem(
                f"heads {heads} does not divide d_model {case.d_model}, from which {derived[0]} 0 is derived",
                derived[0],
                f"choose heads that divide d_model, or set {', '.join(derived)}",
            )
        rope = self.dims(case)[3]
        if rope % 2:
            return Problem(
                f"qk_rope_head_dim {rope} is odd: RoPE rotates pairs of channels",
                "qk_rope_head_dim",
                "give an even qk_rope_head_dim",
            )
        return shared.network_cannot_build(case, self.values(case))

    def layer_parameters(self, case: Case) -> int:
        d, heads, (d_c, d_q, d_n, d_r, d_v) = case.d_model, case.heads or 0, self.dims(case)
        query = d * d_q + d_q + d_q * heads * (d_n + d_r) if d_q else d * heads * (d_n + d_r)
        return query + d * (d_c + d_r) + d_c + d_c * heads * (d_n + d_v) + heads * d_v * d

    def parameters(self, case: Case) -> int:
        opt = self.values(case)
        layer = self.layer_parameters(case)
        if opt("scope") != "core":
            d, m = case.d_model, int(opt("ffn_mult"))
            layer += 4 * d + (d * m * d + m * d) + (m * d * d + d)  # two LayerNorms and the FFN, as attention's block
        return shared.network_parameters(case, opt, case.layers * layer)

    # ------------------------------------------------------------------------------------------------ work
    def formula(self, case: Case) -> str:
        stem = shared.scope_stem(self.values(case), f"mla-{self.form(case)}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def pairs(self, case: Case) -> tuple[int, int]:
        """(keys S, kept pairs P per head and sequence) of one call."""
        if case.mode == "decode":
            return case.span, case.span
        s = case.seq_len
        return s, shared.causal_pairs(s, s) if case.causal else s * s

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        d, heads, (d_c, d_q, d_n, d_r, d_v) = case.d_model, case.heads or 0, self.dims(case)
        batch, tokens = case.batch, shared.call_tokens(case)
        keys, pairs = self.pairs(case)
        query = d * d_q + d_q * heads * (d_n + d_r) if d_q else d * heads * (d_n + d_r)
        projections = 2 * batch * tokens * (query + d * (d_c + d_r) + heads * d_v * d)
        if self.form(case) == "naive":
            up = 2 * batch * keys * d_c * heads * (d_n + d_v)
            core = 2 * batch * heads * pairs * (d_n + d_r + d_v)
        else:
            up = 2 * batch * tokens * heads * (d_n * d_c + d_c * d_v)
            core = 2 * batch * heads * pairs * (2 * d_c + d_r)
        forward = {"projections": case.layers * projections, "up": case.layers * up, "core": case.layers * core}
        if self.option(case, "scope") != "core":
            forward["ffn"] = case.layers * shared.ffn_flops(case, self.values(case))
        numerator, denominator = _CORE_BACKWARD
        backward = {
            name: flops * numerator // denominator if name == "core" else shared.MATMUL_BACKWARD * flops
            for name, flops in forward.items()
        }
        return forward, backward

    # ------------------------------------------------------------------------------------------------ decode
    def latent_width(self, case: Case) -> int:
        """Elements one token leaves in one layer's cache: the latent and the shared rotary key."""
        d_c, _, _, d_r, _ = self.dims(case)
        return d_c + d_r

    def kept_keys(self, case: Case) -> tuple[str, ...]:
        return ()  # the latent cache is kept in the case's dtype: no kv_dtype of its own (yet)

    def state_bytes(self, case: Case) -> int:
        return case.layers * case.batch * case.span * self.latent_width(case) * shared.DTYPE_BYTES[case.dtype]

    def state_written(self, case: Case, state_bytes: int) -> int:
        """A step writes the new token's latent: one of ``span`` slots."""
        return state_bytes // max(case.span, 1)

    def prefill_carries(self, case: Case) -> bool:
        return False  # a context attends to all of itself: one pass fills the cache (chunks append to it)

    def claim_role(self, case: Case) -> ClaimRole | None:
        # Full causal softmax attention, but with a cache a fraction of multi-head attention's: compared in its own
        # right, not the attention the article's claims are about.
        return None

    def peak_dtype(self, case: Case) -> str:
        return case.dtype  # every product runs in the model's dtype

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"

    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        return shared.embedding_table(case, self.values(case))


FAMILY = MLAFamily()
