"""Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060), torch-free: names, options, sizes, FLOPs,
decode state. The torch half is ``attnbench.families.mamba2.layers``.

A selective state-space layer: x → in_proj → (z, xBC, dt); a depthwise causal conv and SiLU over xBC; the SSD scan
h_t = exp(dt_t·A)·h_{t−1} + dt_t·x_t⊗B_t, y_t = C_t·h_t + D·x_t per head (H heads of P channels, a state of N per
channel, B and C shared by H/G heads of a group); a gated RMSNorm (y ⊙ SiLU(z)); out_proj. It joins the recurrent
side: it trains in parallel (the chunked SSD form: attention-like blocks inside chunks of C tokens, a recurrence
across them) and decodes as an RNN from a state constant in n. d_inner = expand·d_model, H = d_inner / P.

Parameters of one layer, mamba_ssm's layout: in_proj d_model·(2·d_inner + 2·G·N + H) (no bias); the conv
conv_dim·d_conv + conv_dim (conv_dim = d_inner + 2·G·N); dt_bias, A_log and D, H each; the norm's weight d_inner;
out_proj d_inner·d_model (no bias). A block adds its LayerNorm (2·d_model): pre-norm, the layer, the residual.

FLOPs, matrix products only (2 per multiply-add), per layer and sequence of T tokens: the projections
2·T·d_model·(2·d_inner + 2·G·N + H) and 2·T·d_inner·d_model; the scan, per head:
- chunked (k chunks of l = min(C, T) tokens, the last padded to a whole chunk, which the kernel computes too):
  inside each chunk the scores C·Bᵀ (2·l²·N) and their product with x (2·l²·P), the chunk's final state
  (2·l·N·P) and the states' contribution to the output (2·l·N·P); across chunks the (k+1)² transfer of states
  between the chunks' boundaries (2·(k+1)²·N·P), as the paper's Listing 1 computes them and the torch form does;
  mamba_ssm's kernel (``kernel: mamba_ssm``, its own formula id) passes them with a linear scan instead
  (``_state_passing_fwd``: state_c = exp(ΣA_c)·state_{c−1} + the chunk's, element-wise), which is not counted: at
  d_model 1024 and chunk 64 the quadratic term is ≈ 14 % of the torch form's count at 32k tokens, ≈ 38 % at 128k;
- recurrent (and a decode step, which is one of its steps): per token the state update dt·x⊗B (2·P·N) and the
  readout C·h (2·P·N).
The depthwise conv (2·(T + d_conv − 1)·conv_dim·d_conv as torch computes it, padding included), the gates and the
norm are not counted: the conv is O(size × d_conv), like the element-wise work. Backward is twice each product.

Decode state per layer and sequence: the conv's last d_conv inputs (conv_dim · d_conv, the model's dtype) and the
SSM state (H · P · N, in float32 for 16-bit models, the scan's dtype): constant in n.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import Family, ModelSpec, OptionSpec, Package, Parts, Problem, ValueOf

FORMS: tuple[str, ...] = ("chunked", "recurrent")
# Inserted before the version of a chunked formula whose kernel passes states linearly: mamba2-chunked-mamba_ssm-v1.
KERNEL_SUFFIX = "-mamba_ssm"
_OPTIONS = (
    OptionSpec(
        "form",
        str,
        "chunked",
        "chunked: the SSD form, attention-like blocks inside chunks and the recurrence across them (how Mamba-2 "
        "trains); recurrent: the scan one token at a time (how it decodes)",
        choices=FORMS,
    ),
    OptionSpec("chunk", int, 64, "tokens per chunk of the chunked form", minimum=1, maximum=65_536),
    OptionSpec("d_state", int, 64, "N: the state per channel (mamba_ssm's d_state)", minimum=1, maximum=1024),
    OptionSpec("head_dim", int, 64, "P: channels per SSM head; d_inner / P heads", minimum=1, maximum=4096),
    OptionSpec("expand", int, 2, "d_inner = expand × d_model", minimum=1, maximum=16),
    OptionSpec("d_conv", int, 4, "width of the depthwise causal conv", minimum=1, maximum=64),
    OptionSpec("groups", int, 1, "G: B and C are shared by heads / G heads of a group", minimum=1, maximum=1024),
    OptionSpec(
        "kernel",
        str,
        "torch",
        "torch: the plain-torch forms (every device); mamba_ssm: the chunked form as the mamba-ssm package's fused "
        "Triton kernel (mamba_chunk_scan_combined; CUDA, when mamba_ssm is installed: an unsupported row otherwise)",
        choices=("torch", "mamba_ssm"),
    ),
    shared.SCOPE,
    shared.VOCAB,
    shared.positional(rope=False),
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)


class Mamba2Family(Family):
    name = "mamba2"
    order = 25
    models = (
        ModelSpec(
            "mamba2",
            "recurrent",
            "mamba2",
            "Mamba-2 (Dao & Gu 2024, arXiv:2405.21060): a selective SSM layer, trained by the chunked SSD form and "
            "decoded as an RNN from an (H, P, N) state and the conv's last inputs",
            options=_OPTIONS,
        ),
    )
    # A decode step is one step of the recurrence, whatever form (and kernel) filled the state.
    decode_inert = frozenset({"form", "chunk", "kernel"})
    packages = (Package("mamba-ssm", "mamba_ssm"),)
    # claim_role: none. A selective SSM trained by its chunked (parallel) form is neither the RNN the article's
    # claims are about nor its attention: it is compared in its own right (its crossovers, results/README.md).

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        if name == "chunk" and value_of("form") != "chunked":
            return Problem("chunk sizes the chunks of form chunked only", name, "remove chunk, or use form: chunked")
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
        heads, groups = inner // head_dim, int(self.option(case, "groups"))
        if heads % groups:
            return Problem(
                f"groups {groups} does not divide the {heads} SSM heads (d_inner {inner} / head_dim {head_dim})",
                "groups",
                f"groups that divide {heads}: {', '.join(str(g) for g in range(1, heads + 1) if heads % g == 0)}",
            )
        return shared.network_cannot_build(case, self.values(case))

    # ------------------------------------------------------------------------------------------------ sizes
    def inner(self, case: Case) -> int:
        return int(self.option(case, "expand")) * case.d_model

    def ssm_heads(self, case: Case) -> int:
        return self.inner(case) // int(self.option(case, "head_dim"))

    def conv_dim(self, case: Case) -> int:
        return self.inner(case) + 2 * int(self.option(case, "groups")) * int(self.option(case, "d_state"))

    def layer_parameters(self, case: Case) -> int:
        d, inner, heads = case.d_model, self.inner(case), self.ssm_heads(case)
        groups, state, width = (
            int(self.option(case, "groups")),
            int(self.option(case, "d_state")),
            int(self.option(case, "d_conv")),
        )
        in_proj = d * (2 * inner + 2 * groups * state + heads)
        conv = self.conv_dim(case) * width + self.conv_dim(case)
        return in_proj + conv + 3 * heads + inner + inner * d

    def parameters(self, case: Case) -> int:
        block = self.layer_parameters(case) + (2 * case.d_model if self.option(case, "scope") != "core" else 0)
        return shared.network_parameters(case, self.values(case), case.layers * block)

    # ------------------------------------------------------------------------------------------------ work
    def _form(self, case: Case) -> str:
        return "recurrent" if case.mode == "decode" else str(self.option(case, "form"))

    def _linear_states(self, case: Case) -> bool:
        """Whether the chunks' states pass by mamba_ssm's linear scan rather than the torch form's (k+1)² product."""
        return self._form(case) == "chunked" and self.option(case, "kernel") == "mamba_ssm"

    def formula(self, case: Case) -> str:
        stem = shared.scope_stem(self.values(case), f"mamba2-{self._form(case)}")
        return shared.versioned(
            stem, KERNEL_SUFFIX * self._linear_states(case), shared.DECODE_SUFFIX * (case.mode == "decode")
        )

    def scan_flops(self, case: Case) -> int:
        """The SSD's products of one layer over one call, every head and sequence (module notes)."""
        t = shared.call_tokens(case)
        n, p, heads = int(self.option(case, "d_state")), int(self.option(case, "head_dim")), self.ssm_heads(case)
        if self._form(case) == "recurrent":
            per_head = t * 4 * p * n
        else:
            block = min(int(self.option(case, "chunk")), max(t, 1))  # a sequence shorter than a chunk is one of its own
            chunks = -(-t // block)  # the last one padded to a whole chunk: that work is done too
            inside = chunks * (2 * block * block * (n + p) + 4 * block * n * p)
            # mamba_ssm passes the states along with a linear, element-wise scan (not counted); the torch form
            # multiplies them by a (k+1) × (k+1) decay matrix.
            per_head = inside + (0 if self._linear_states(case) else 2 * (chunks + 1) ** 2 * n * p)
        return case.batch * heads * per_head

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        tokens, d, inner = case.batch * shared.call_tokens(case), case.d_model, self.inner(case)
        groups, state, heads = int(self.option(case, "groups")), int(self.option(case, "d_state")), self.ssm_heads(case)
        projections = 2 * tokens * d * (2 * inner + 2 * groups * state + heads) + 2 * tokens * inner * d
        forward = {"projections": case.layers * projections, "scan": case.layers * self.scan_flops(case)}
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    # ------------------------------------------------------------------------------------------------ decode
    def state_dtype(self, case: Case) -> str:
        return shared.kept(case, "float32" if shared.DTYPE_BYTES[case.dtype] < 4 else case.dtype)

    def state_bytes(self, case: Case) -> int:
        conv = (
            self.conv_dim(case) * int(self.option(case, "d_conv")) * shared.DTYPE_BYTES[shared.kept(case, case.dtype)]
        )
        ssm = self.ssm_heads(case) * int(self.option(case, "head_dim")) * int(self.option(case, "d_state"))
        ssm_bytes = ssm * shared.DTYPE_BYTES[self.state_dtype(case)]
        return case.layers * case.batch * (conv + ssm_bytes)

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"

    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        return shared.embedding_table(case, self.values(case))

    def intermediate_elements(self, case: Case) -> int:
        """Per layer and token in_proj's output (z, xBC and dt: read by the gate, the conv and the scan), the conv's
        output (read by the scan), the scan's output y (read by the gated norm) and the norm's (read by out_proj); a
        block adds its LayerNorm's output."""
        groups, state, heads = int(self.option(case, "groups")), int(self.option(case, "d_state")), self.ssm_heads(case)
        inner = self.inner(case)
        layer = (2 * inner + 2 * groups * state + heads) + self.conv_dim(case) + 2 * inner
        if self.option(case, "scope") != "core":
            layer += case.d_model
        return case.layers * case.tokens * layer + shared.network_interfaces(case, self.values(case))


FAMILY = Mamba2Family()
