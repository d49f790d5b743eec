"""Kimi Delta Attention (KDA), torch-free: names, options, sizes, FLOPs, decode state. The torch half is
``attnbench.families.kda.layers``.

KDA (Kimi Team 2025, "Kimi Linear", arXiv:2510.26692) is the gated delta rule with a fine-grained decay: where Gated
DeltaNet multiplies the whole memory by one α_t per head, KDA decays each key channel by its own α_t ∈ (0, 1)^{d_k}.
Per head, with the paper's S_t (d_v × d_k):

    S_t = S_{t−1} · Diag(α_t) (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,    o_t = S_t q_t / √d_k

q_t and k_t are L2-normalised, β_t = σ(·), log α_t = −e^{A_log}·softplus(f_t + dt_bias) with f_t a low-rank
projection of the input (rank d_v) and dt_bias one per key channel (fla's ``fused_kda_gate``). The layer as fla
ships it (``fla/layers/kda.py``, Kimi Linear's ``KimiDeltaAttention``): projections to q, k (H·d_k each), v (H·d_v)
and β (H); a causal depthwise conv of d_conv taps and SiLU over q, k and v; the decay's low-rank projection
d → d_v → H·d_k; the rule; a per-head RMSNorm (one weight of d_v) times the sigmoid of an output gate, itself a
low-rank projection d → d_v → H·d_v with a bias (fla's ``FusedRMSNormGated(activation='sigmoid')``); the output
projection H·d_v → d_model. d_k = head_dim (0: d_model / heads), d_v = expand_v·d_k (Kimi Linear: 128 and 1).

It joins the recurrent side, as Gated DeltaNet does: trained in its chunked form, decoded as an RNN from a state
constant in n; compared in its own right (no role in the article's claims).

Parameters of one layer: d·(2H·d_k + H·d_v + H) the q, k, v, β projections; d_conv·(2H·d_k + H·d_v) the conv;
d·d_v + d_v·H·d_k the decay's projection, H·d_k + H for dt_bias and A_log; with the output gate d·d_v + d_v·H·d_v
+ H·d_v; the norm's d_v; the output projection H·d_v·d. A block adds its LayerNorm (2·d_model).

FLOPs, matrix products only (2 per multiply-add), per layer and sequence of T tokens: the projections
2·T·(d·(2H·d_k + H·d_v + H) + d·d_v + d_v·H·d_k [+ d·d_v + d_v·H·d_v] + H·d_v·d); the rule per head as Gated
DeltaNet's (the per-channel decay is element-wise): recurrent (and a decode step) 6·d_k·d_v per token; chunked, per
chunk of c tokens, 4·c²·d_k (the decay-weighted KKᵀ and QKᵀ), 2·c²·d_v, 6·c·d_k·d_v and the solve c(c−1)(d_k + d_v).
Backward twice each product. Formula ids ``kda-<form>[-<scope>][-decode]-v1``.

Decode state per layer and sequence: the conv's last d_conv − 1 inputs ((d_conv − 1)·(2H·d_k + H·d_v), the model's
dtype) and the matrix memory (H·d_k·d_v, float32 for 16-bit models, as fla keeps it): constant in n.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import Family, ModelSpec, OptionSpec, Parts, Problem, ValueOf
from attnbench.families.deltanet.spec import (
    FLA,
    NETWORK,
    chunk_option,
    chunked,
    form_of,
    form_option,
    heads_problem,
    kernel_no_effect,
    kernel_option,
    solve_flops,
    state_dtype,
)

KDA = "kda"

_OPTIONS = (
    form_option("KDA"),
    chunk_option(),
    kernel_option("chunk_kda"),
    OptionSpec("head_dim", int, 0, "d_k: key width per head; 0 = d_model / heads", minimum=0, maximum=4096),
    OptionSpec("expand_v", int, 1, "d_v = expand_v × d_k (fla's expand_v; Kimi Linear: 1)", minimum=1, maximum=16),
    OptionSpec("d_conv", int, 4, "taps of the causal depthwise conv over q, k, v", minimum=1, maximum=64),
    OptionSpec(
        "output_gate",
        bool,
        True,
        "the norm's output times the sigmoid of a low-rank gate projected from the input (Kimi Linear's g_proj)",
    ),
    *NETWORK,
)


class KDAFamily(Family):
    name = "kda"
    order = 28
    models = (
        ModelSpec(
            KDA,
            "recurrent",
            "kda",
            "Kimi Delta Attention (Kimi Linear, arXiv:2510.26692): the gated delta rule with a per-channel decay, "
            "trained by the chunked WY/UT form, decoded as an RNN from an (H, d_k, d_v) state",
            options=_OPTIONS,
            heads=True,
        ),
    )
    # A decode step is one step of the recurrence, whatever form (and kernel) filled the state.
    decode_inert = frozenset({"form", "chunk", "kernel"})
    packages = (FLA,)
    # claim_role: none, as Gated DeltaNet: trained by its chunked form, compared in its own right.

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return kernel_no_effect(name, value_of)

    def cannot_build(self, case: Case) -> Problem | None:
        return heads_problem(case, int(self.option(case, "head_dim"))) or shared.network_cannot_build(
            case, self.values(case)
        )

    # ------------------------------------------------------------------------------------------------ sizes
    def head_dims(self, case: Case) -> tuple[int, int]:
        """(d_k, d_v) of every head."""
        d_k = int(self.option(case, "head_dim")) or case.d_model // (case.heads or 1)
        return d_k, d_k * int(self.option(case, "expand_v"))

    def conv_dim(self, case: Case) -> int:
        heads, (d_k, d_v) = case.heads or 0, self.head_dims(case)
        return 2 * heads * d_k + heads * d_v

    def projection_weights(self, case: Case) -> int:
        """Weights of every matrix of one layer (each one multiply-add per token)."""
        d, heads, (d_k, d_v) = case.d_model, case.heads or 0, self.head_dims(case)
        weights = d * (self.conv_dim(case) + heads) + d * d_v + d_v * heads * d_k + heads * d_v * d
        if self.option(case, "output_gate"):
            weights += d * d_v + d_v * heads * d_v
        return weights

    def layer_parameters(self, case: Case) -> int:
        heads, (d_k, d_v) = case.heads or 0, self.head_dims(case)
        conv = self.conv_dim(case) * int(self.option(case, "d_conv"))
        gate_bias = heads * d_v if self.option(case, "output_gate") else 0
        return self.projection_weights(case) + conv + heads * d_k + heads + gate_bias + d_v

    def parameters(self, case: Case) -> int:
        block = self.layer_parameters(case) + (2 * case.d_model if self.option(case, "scope") != "core" else 0)
        return shared.network_parameters(case, self.values(case), case.layers * block)

    # ------------------------------------------------------------------------------------------------ work
    def formula(self, case: Case) -> str:
        form = form_of(case, str(self.option(case, "form")))
        stem = shared.scope_stem(self.values(case), f"kda-{form}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def core_flops(self, case: Case) -> tuple[int, int]:
        """(products, solve) of the rule in one layer over one call, every head and sequence (module notes)."""
        t, (d_k, d_v) = shared.call_tokens(case), self.head_dims(case)
        scale = case.batch * (case.heads or 0)
        if form_of(case, str(self.option(case, "form"))) == "recurrent":
            return scale * t * 6 * d_k * d_v, 0

        def per_chunk(c: int) -> tuple[int, int]:
            return 4 * c * c * d_k + 2 * c * c * d_v + 6 * c * d_k * d_v, solve_flops(c, d_k, d_v)

        products, solve = chunked(t, int(self.option(case, "chunk")), per_chunk)
        return scale * products, scale * solve

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        tokens = case.batch * shared.call_tokens(case)
        projections = 2 * tokens * self.projection_weights(case)
        core, solve = self.core_flops(case)
        forward = {"projections": case.layers * projections, "core": case.layers * core}
        if solve:
            forward["solve"] = case.layers * solve
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    # ------------------------------------------------------------------------------------------------ decode
    def state_dtype(self, case: Case) -> str:
        return state_dtype(case)

    def state_bytes(self, case: Case) -> int:
        heads, (d_k, d_v) = case.heads or 0, self.head_dims(case)
        conv = (
            (int(self.option(case, "d_conv")) - 1)
            * self.conv_dim(case)
            * shared.DTYPE_BYTES[shared.kept(case, case.dtype)]
        )
        matrix = heads * d_k * d_v * shared.DTYPE_BYTES[self.state_dtype(case)]
        return case.layers * case.batch * (conv + matrix)

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"


FAMILY = KDAFamily()
