"""Mamba-3, torch-free: names, options, sizes, FLOPs, decode state. The torch half is
``attnbench.families.mamba3.layers``.

Mamba-3 (Lahoti, Li, Chen, Wang, Bick, Kolter, Dao & Gu 2026, arXiv:2603.15569) changes Mamba-2 in three ways, each
as the paper and mamba_ssm's ``Mamba3`` (``mamba_ssm/modules/mamba3.py``) define them. Per head, with state
h_t ∈ ℝ^{N×P} (key-major), Δ_t = softplus(dd_dt + dt_bias), A_t = −softplus(dd_A) ≤ −10⁻⁴ (data-dependent),
α_t = e^{Δ_t A_t}, λ_t = σ(trap_t):

* trapezoidal discretisation: h_t = α_t h_{t−1} + β_t k_{t−1} x_{t−1}ᵀ + γ_t k_t x_tᵀ with β_t = (1 − λ_t)Δ_t α_t and
  γ_t = λ_t Δ_t (λ = 1 is Mamba-2's exponential Euler); no short conv;
* a complex state as data-dependent RoPE on B and C: θ_t = θ_{t−1} + π·tanh(φ_t)·Δ_t per head and angle,
  k_t = R(θ_t)(RMSNorm(B_t) + b_B), q_t = R(θ_t)(RMSNorm(C_t) + b_C), rotating pairs of the first
  2·⌊N·rope_fraction / 2⌋ channels (the trainable biases b_B, b_C start at 1);
* MIMO of rank R (``mimo_rank`` > 1): B_t, C_t are R × N, the head's input x_t is lifted to R copies
  x_{t,r} = x_t ⊙ w^x_r, the state takes the rank-R update Σ_r k_{t,r} x_{t,r}ᵀ, and the R outputs
  y_{t,r} = h_tᵀ q_{t,r} + D x_{t,r}, gated by SiLU(z ⊙ w^z_r), are summed with weights w^o_r. R = 1 is SISO.

    y_t = Σ_r w^o_r ⊙ (h_tᵀ q_{t,r} + D x_{t,r}) ⊙ SiLU(z_t ⊙ w^z_r),    out = W_out y

The layer: one input projection d → [z, x (d_inner each), B, C (R·N each), dd_dt, dd_A, trap (H each), φ (S angles)],
the rule, the gate, the output projection d_inner → d. H = d_inner / head_dim, d_inner = expand·d_model, one group
of B and C shared by the heads.

Parameters of one layer: d·(2·d_inner + 2·R·N + 3H + S); dt_bias and D (H each); b_B, b_C (H·R·N each); the two
norms' weights (N each); with MIMO w^x, w^z, w^o (H·R·P each); the output projection d_inner·d.

FLOPs (2 per multiply-add), per layer and sequence of T tokens: the projections 2·T·d·(2·d_inner + 2RN + 3H + S) +
2·T·d_inner·d; the rule per head:
- recurrent (and a decode step): the two rank-R writes and the readout, 6·R·N·P per token;
- chunked, per chunk of c tokens: QKᵀ over the c·R rows 2(cR)²N, its product with X 2(cR)²P, the readout of the
  entering state and the state's write 4·cR·N·P.
The rotations, norms, gates and the MIMO lifts are element-wise, not counted. Backward: twice each product. Formula
ids ``mamba3-<form>[-<scope>][-decode]-v1``.

Decode state per layer and sequence: the angles (H·S), the state (H·N·P), the last rotated k and lifted x
(H·R·(N + P)), all in float32 for 16-bit models (mamba_ssm keeps the last k and x in the model's dtype): constant in n.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import Family, ModelSpec, OptionSpec, Package, Parts, Problem, ValueOf

FORMS: tuple[str, ...] = ("chunked", "recurrent")
KERNELS: tuple[str, ...] = ("torch", "mamba_ssm")
ROPE_FRACTIONS = (0.5, 1.0)  # mamba_ssm asserts one of these

_OPTIONS = (
    OptionSpec(
        "form",
        str,
        "chunked",
        "chunked: attention-like blocks inside chunks, the recurrence across them (how Mamba-3 trains); recurrent: "
        "one token at a time (how it decodes)",
        choices=FORMS,
    ),
    OptionSpec("chunk", int, 64, "tokens per chunk of the chunked form", minimum=1, maximum=65_536),
    OptionSpec("d_state", int, 128, "N: the state per channel (mamba_ssm's d_state)", minimum=2, maximum=1024),
    OptionSpec("head_dim", int, 64, "P: channels per SSM head; d_inner / P heads", minimum=1, maximum=4096),
    OptionSpec("expand", int, 2, "d_inner = expand × d_model", minimum=1, maximum=16),
    OptionSpec(
        "mimo_rank",
        int,
        1,
        "R: 1 = SISO; R > 1 = MIMO of rank R (mamba_ssm's is_mimo, mimo_rank)",
        minimum=1,
        maximum=64,
    ),
    OptionSpec(
        "rope_fraction",
        float,
        0.5,
        "the fraction of B's and C's N channels the data-dependent RoPE rotates (0.5 or 1.0, mamba_ssm's)",
        minimum=0.5,
        maximum=1.0,
    ),
    OptionSpec(
        "kernel",
        str,
        "torch",
        "torch: the plain-torch forms (every device); mamba_ssm: the chunked SISO form as the mamba-ssm package's "
        "fused Triton kernel (mamba3_siso_combined; CUDA, when mamba_ssm has it: an unsupported row otherwise)",
        choices=KERNELS,
    ),
    shared.SCOPE,
    shared.VOCAB,
    shared.positional(rope=False),
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)


def core_dtype(dtype: str) -> str:
    return "float32" if shared.DTYPE_BYTES[dtype] < 4 else dtype


class Mamba3Family(Family):
    name = "mamba3"
    order = 29
    models = (
        ModelSpec(
            "mamba3",
            "recurrent",
            "mamba3",
            "Mamba-3 (Lahoti et al. 2026, arXiv:2603.15569): trapezoidal discretisation, a complex state as "
            "data-dependent RoPE on B and C, and MIMO; trained by its chunked form, decoded as an RNN",
            options=_OPTIONS,
        ),
    )
    # A decode step is one step of the recurrence, whatever form (and kernel) filled the state.
    decode_inert = frozenset({"form", "chunk", "kernel"})
    packages = (Package("mamba-ssm", "mamba_ssm"),)
    # claim_role: none, as Mamba-2: trained by a parallel form, compared in its own right.

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        if name == "chunk" and (value_of("form") != "chunked" or value_of("kernel") == "mamba_ssm"):
            return Problem(
                "chunk sizes the chunks of the torch chunked form only",
                name,
                "remove chunk, or use form: chunked with kernel: torch",
            )
        if name == "kernel" and value_of("form") != "chunked":
            return Problem(
                "kernel mamba_ssm is the chunked form's kernel; the recurrent form is plain torch",
                name,
                "use form: chunked, or remove kernel",
            )
        return shared.network_no_effect(name, value_of, recurrent=True)

    def cannot_build(self, case: Case) -> Problem | None:
        inner, head_dim = self.inner(case), int(self.option(case, "head_dim"))
        if inner % head_dim:
            return Problem(
                f"d_inner = expand × d_model = {inner} is not a multiple of head_dim {head_dim}",
                "head_dim",
                f"choose head_dim dividing {inner}",
            )
        fraction = float(self.option(case, "rope_fraction"))
        if fraction not in ROPE_FRACTIONS:
            return Problem(
                f"rope_fraction {fraction} is not one of mamba_ssm's: 0.5, 1.0", "rope_fraction", "use 0.5 or 1.0"
            )
        if self.angles(case) < 1:
            return Problem(
                f"d_state {self.option(case, 'd_state')} leaves no pair of channels to rotate",
                "d_state",
                "use d_state of at least 4",
            )
        return shared.network_cannot_build(case, self.values(case))

    # ------------------------------------------------------------------------------------------------ sizes
    def inner(self, case: Case) -> int:
        return int(self.option(case, "expand")) * case.d_model

    def ssm_heads(self, case: Case) -> int:
        return self.inner(case) // int(self.option(case, "head_dim"))

    def angles(self, case: Case) -> int:
        """S: the rotation angles, ⌊N·rope_fraction / 2⌋ (mamba_ssm's num_rope_angles)."""
        return int(int(self.option(case, "d_state")) * float(self.option(case, "rope_fraction"))) // 2

    def sizes(self, case: Case) -> tuple[int, int, int, int]:
        """(H, P, N, R)."""
        return (
            self.ssm_heads(case),
            int(self.option(case, "head_dim")),
            int(self.option(case, "d_state")),
            int(self.option(case, "mimo_rank")),
        )

    def projected(self, case: Case) -> int:
        heads, _, n, rank = self.sizes(case)
        return 2 * self.inner(case) + 2 * rank * n + 3 * heads + self.angles(case)

    def layer_parameters(self, case: Case) -> int:
        d, (heads, p, n, rank) = case.d_model, self.sizes(case)
        mimo = 3 * heads * rank * p if rank > 1 else 0
        return d * self.projected(case) + 2 * heads + 2 * heads * rank * n + 2 * n + mimo + self.inner(case) * d

    def parameters(self, case: Case) -> int:
        block = self.layer_parameters(case) + (2 * case.d_model if self.option(case, "scope") != "core" else 0)
        return shared.network_parameters(case, self.values(case), case.layers * block)

    # ------------------------------------------------------------------------------------------------ work
    def form(self, case: Case) -> str:
        return "recurrent" if case.mode == "decode" else str(self.option(case, "form"))

    def formula(self, case: Case) -> str:
        stem = shared.scope_stem(self.values(case), f"mamba3-{self.form(case)}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def core_flops(self, case: Case) -> int:
        t, (heads, p, n, rank) = shared.call_tokens(case), self.sizes(case)
        scale = case.batch * heads
        if self.form(case) == "recurrent":
            return scale * t * 6 * rank * n * p
        whole, tail = divmod(t, int(self.option(case, "chunk")))

        def per_chunk(c: int) -> int:
            rows = c * rank
            return 2 * rows * rows * (n + p) + 4 * rows * n * p

        return scale * (whole * per_chunk(int(self.option(case, "chunk"))) + (per_chunk(tail) if tail else 0))

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        tokens, d = case.batch * shared.call_tokens(case), case.d_model
        projections = 2 * tokens * d * self.projected(case) + 2 * tokens * self.inner(case) * d
        forward = {"projections": case.layers * projections, "core": case.layers * self.core_flops(case)}
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    # ------------------------------------------------------------------------------------------------ decode
    def state_dtype(self, case: Case) -> str:
        return shared.kept(case, core_dtype(case.dtype))

    def state_bytes(self, case: Case) -> int:
        heads, p, n, rank = self.sizes(case)
        elements = heads * self.angles(case) + heads * n * p + heads * rank * (n + p)
        return case.layers * case.batch * elements * shared.DTYPE_BYTES[self.state_dtype(case)]

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"


FAMILY = Mamba3Family()
