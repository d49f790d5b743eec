"""RWKV-7 "Goose" (Peng et al. 2025, arXiv:2503.14456), its time-mix layer, torch-free: names, options, sizes, FLOPs,
decode state. The torch half is ``attnbench.families.rwkv7.layers``.

A generalised delta rule: per head a matrix memory S (N × N, N = d_model / heads) decays per channel and is written by
a delta-rule step whose removal key κ̂ and replacement key k̃ differ, the step size a per channel (the paper's
"in-context learning rate"). In the paper's row-vector convention:

    S_t = S_{t−1} (diag(w_t) − κ̂_tᵀ (a_t ⊙ κ̂_t)) + v_tᵀ k̃_t,    o_t = S_t r_t
    w_t = exp(−e^{−1/2} σ(w₀ + tanh(x^w W₁) W₂)),  a_t = σ(a₀ + x^a A₁ A₂),  κ̂_t = L2norm_head(k_t ⊙ ξ),
    k̃_t = k_t ⊙ (1 + (a_t − 1) ⊙ α),  x^* = x_t + (x_{t−1} − x_t) ⊙ μ_*  (token shift)
    out = ((GroupNorm_head(o_t) + (r_t·(ρ ⊙ k̃_t)) v_t) ⊙ σ(x^g G₁) G₂) W_o

as fla's ``RWKV7Attention`` computes it (``fla/layers/rwkv7.py``) for its first layer: the value residual of the
later layers (v_first, one more LoRA) is left out. The decay form is fla's, identical to the paper's
(exp(−softplus(−z)) = σ(z)).

It joins the recurrent side: it trains in its chunked form (the WY/UT representation generalised to a
diagonal-plus-low-rank transition: matrix products and one triangular solve inside chunks, a recurrence across
them) and decodes as an RNN from a state constant in n. It is compared in its own right: no role in the claims.

Parameters of one layer: the six token-shift mixes μ (6d), ξ and α (2d), ρ (d = H·N); r, k, v, o projections (4d²);
the decay LoRA (2d·r_w + d), the learning-rate LoRA (2d·r_a + d), the gate LoRA (2d·r_g, no bias); the GroupNorm's
weight and bias (2d). fla's ranks by default: r_w = r_a = max(32, round(2.5√d·(N/64)/32)·32), r_g =
max(32, round(5√d/32)·32). A block adds its LayerNorm (2·d_model).

FLOPs, matrix products only (2 per multiply-add), per layer and sequence of T tokens: the projections 8·T·d² and the
LoRAs 4·T·d·(r_w + r_a + r_g); the rule, per head (d_k = d_v = N):
- recurrent (and a decode step, which is one of its steps): per token the removed row u_tᵀH, the two rank-1 writes
  and the readout r_tᵀH, 8·d_k·d_v;
- chunked: per chunk of c tokens (T // C whole chunks and one of T mod C) the four c × c score matrices (8·c²·d_k),
  their three products with values and corrections (6·c²·d_v), the state's four products (8·c·d_k·d_v), and the
  triangular solve with d_k + d_v right-hand sides, c(c − 1)(d_k + d_v) (the part ``solve``).
The token shift, the norms, the decays, the bonus term and the gates' activations are not counted. Backward is twice
each product.

Decode state per layer and sequence: the previous token's input (d, the model's dtype) and the memory (H·N·N, float32
for 16-bit models): constant in n.
"""

from __future__ import annotations

import math

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import Family, ModelSpec, OptionSpec, Parts, Problem, ValueOf
from attnbench.families.deltanet.spec import (
    FLA,
    FLA_VERSION,
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

# The torch chunked form factors the decays from each chunk's start: e^{0.61·C} must stay finite in float32.
MAX_CHUNK = 128


def _rank(name: str, what: str) -> OptionSpec:
    return OptionSpec(name, int, 0, f"rank of the {what} LoRA; 0 = fla's default for the size", minimum=0, maximum=4096)


_OPTIONS = (
    form_option("RWKV-7"),
    chunk_option(MAX_CHUNK, " (at most 128: the torch form's in-chunk decays must stay finite in float32)"),
    kernel_option("chunk_rwkv7"),
    _rank("decay_rank", "decay"),
    _rank("a_rank", "in-context learning rate"),
    _rank("gate_rank", "output gate"),
    *NETWORK,
)


def default_ranks(d_model: int, head_dim: int) -> tuple[int, int, int]:
    """fla's LoRA ranks (decay, learning rate, gate) for a layer of this size (``fla/layers/rwkv7.py``)."""
    decay = max(32, int(round(2.5 * math.sqrt(d_model) * (head_dim / 64) / 32) * 32))
    gate = max(32, int(round(5 * math.sqrt(d_model) / 32) * 32))
    return decay, decay, gate


class RWKV7Family(Family):
    name = "rwkv7"
    order = 27
    models = (
        ModelSpec(
            "rwkv7",
            "recurrent",
            "rwkv7",
            "RWKV-7 'Goose' (Peng et al. 2025, arXiv:2503.14456): a generalised delta rule with per-channel decay and "
            "learning rate, trained by the chunked form, decoded as an RNN from an (H, N, N) state",
            options=_OPTIONS,
            heads=True,
        ),
    )
    # A decode step is one step of the recurrence, whatever form (and kernel) filled the state.
    decode_inert = frozenset({"form", "chunk", "kernel"})
    packages = (FLA,)
    extras = (FLA_VERSION,)
    # claim_role: none, as Mamba-2 and DeltaNet: trained by its chunked form, compared in its own right.

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return kernel_no_effect(name, value_of)

    def cannot_build(self, case: Case) -> Problem | None:
        return heads_problem(case, None) or shared.network_cannot_build(case, self.values(case))

    # ------------------------------------------------------------------------------------------------ sizes
    def head_dim(self, case: Case) -> int:
        return case.d_model // (case.heads or 1)

    def ranks(self, case: Case) -> tuple[int, int, int]:
        """(decay, learning rate, gate) LoRA ranks: the options, or fla's defaults where 0."""
        defaults = default_ranks(case.d_model, self.head_dim(case))
        given = (int(self.option(case, name)) for name in ("decay_rank", "a_rank", "gate_rank"))
        return tuple(rank or default for rank, default in zip(given, defaults, strict=True))  # type: ignore[return-value]

    def layer_parameters(self, case: Case) -> int:
        d = case.d_model
        return 4 * d * d + 2 * d * sum(self.ranks(case)) + 13 * d

    def parameters(self, case: Case) -> int:
        block = self.layer_parameters(case) + (2 * case.d_model if self.option(case, "scope") != "core" else 0)
        return shared.network_parameters(case, self.values(case), case.layers * block)

    # ------------------------------------------------------------------------------------------------ work
    def formula(self, case: Case) -> str:
        form = form_of(case, str(self.option(case, "form")))
        stem = shared.scope_stem(self.values(case), f"rwkv7-{form}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def core_flops(self, case: Case) -> tuple[int, int]:
        """(products, solve) of the rule in one layer over one call, every head and sequence (module notes)."""
        t, n = shared.call_tokens(case), self.head_dim(case)
        scale = case.batch * (case.heads or 0)
        if form_of(case, str(self.option(case, "form"))) == "recurrent":
            return scale * t * 8 * n * n, 0

        def per_chunk(c: int) -> tuple[int, int]:
            return 8 * c * c * n + 6 * c * c * n + 8 * c * n * n, solve_flops(c, n, n)

        products, solve = chunked(t, int(self.option(case, "chunk")), per_chunk)
        return scale * products, scale * solve

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        tokens, d = case.batch * shared.call_tokens(case), case.d_model
        projections = 8 * tokens * d * d + 4 * tokens * d * sum(self.ranks(case))
        core, solve = self.core_flops(case)
        forward = {"projections": case.layers * projections, "core": case.layers * core}
        if solve:
            forward["solve"] = case.layers * solve
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    # ------------------------------------------------------------------------------------------------ decode
    def state_dtype(self, case: Case) -> str:
        return state_dtype(case)

    def state_bytes(self, case: Case) -> int:
        n = self.head_dim(case)
        shift = case.d_model * shared.DTYPE_BYTES[shared.kept(case, case.dtype)]
        memory = (case.heads or 0) * n * n * shared.DTYPE_BYTES[self.state_dtype(case)]
        return case.layers * case.batch * (shift + memory)

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"


FAMILY = RWKV7Family()
