"""Gated DeltaNet and DeltaNet, the delta-rule layers, torch-free: names, options, sizes, FLOPs, decode state. The
torch half is ``attnbench.families.deltanet.layers``.

DeltaNet (Schlag, Irie & Schmidhuber 2021, arXiv:2102.11174; parallelised over the sequence by Yang, Wang, Zhang,
Shen & Kim 2024, arXiv:2406.06484) keeps a matrix memory per head and writes to it by the delta rule: it first reads
what the memory holds for key k_t and replaces that by v_t, a step of size β_t. Gated DeltaNet (Yang, Kautz &
Hatamizadeh 2024, arXiv:2412.06464) adds a decay α_t of the whole memory, as Mamba-2's. Per head, with the paper's
S_t (d_v × d_k):

    S_t = S_{t−1} · α_t (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,    o_t = S_t q_t      (DeltaNet: α_t = 1)

q_t and k_t are L2-normalised, β_t = σ(·) ∈ (0, 1), α_t = exp(−e^{A_log}·softplus(· + dt_bias)). The layer as fla
ships it (``fla/layers/gated_deltanet.py``, ``delta_net.py``): one input projection to q, k (H·d_k each), v (H·d_v),
β (H), the decay's input (H, gated only) and the output gate (H·d_v, where on); a causal depthwise conv of d_conv
taps and SiLU over q, k and v; the rule; a per-head RMSNorm (one weight of d_v shared by the heads), times SiLU of
the output gate where on; the output projection H·d_v → d_model. Heads come from the case; d_k = head_dim (0:
d_model / heads), d_v = expand_v·d_k (fla's defaults: 2 for Gated DeltaNet, 1 for DeltaNet). With ``heads_v`` = H_v
value heads (fla's num_v_heads > num_heads: Qwen3-Next's 32 on 16), v, β, the decay, the gate, the memory and the
output run per value head, each reading its key head's q and k (repeated heads_v / heads times): below, the widths
and counts per head are per value head where the rule's are (H·d_v, H·d_k·d_v, the core's products), per key head
for q and k.

It joins the recurrent side: it trains in its chunked form (the WY/UT representation: inside chunks of C tokens
matrix products and one unit-lower-triangular solve, a recurrence across chunks) and decodes as an RNN from a state
constant in n. It is compared in its own right, as Mamba-2 is: no role in the article's claims.

Parameters of one layer: the input projection d·(2H·d_k + H·d_v + H [+ H gated] [+ H·d_v gate]); the conv
d_conv·(2H·d_k + H·d_v) (no bias); A_log and dt_bias (H each, gated); the norm's weight d_v; the output
projection H·d_v·d. A block adds its LayerNorm (2·d_model).

FLOPs, matrix products only (2 per multiply-add), per layer and sequence of T tokens: the projections
2·T·d·(width of the input projection) + 2·T·H·d_v·d; the rule, per head:
- recurrent (and a decode step, which is one of its steps): per token the read k_tᵀH, the rank-1 write k_t δ_tᵀ and
  the readout q_tᵀH, 6·d_k·d_v;
- chunked: per chunk of c tokens (T // C whole chunks and one of T mod C) KKᵀ and QKᵀ (4·c²·d_k), their product with
  the corrections (2·c²·d_v), the state's three products W·H, (γQ)·H and the write (6·c·d_k·d_v), and the triangular
  solve with d_k + d_v right-hand sides, c(c−1)(d_k + d_v) (the part ``solve``, which torch's FlopCounterMode does
  not see). The c × c products are counted as computed, dense.
The conv, the norms, the decays and gates are not counted. Backward is twice each product (the solve's backward is
one more solve and a c × (d_k + d_v) × c product: a test holds torch's count of a train call within 12 % of this).

Decode state per layer and sequence: the conv's last d_conv − 1 inputs ((d_conv − 1)·(2H·d_k + H·d_v), the model's
dtype) and the matrix memory (H·d_k·d_v, float32 for 16-bit models, as fla keeps it): constant in n.
"""

from __future__ import annotations

from collections.abc import Callable

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import ExtraSpec, Family, ModelSpec, OptionSpec, Package, Parts, Problem, ValueOf

FORMS: tuple[str, ...] = ("chunked", "recurrent")
GATED, PLAIN = "gated-deltanet", "deltanet"
FLA = Package("flash-linear-attention", "fla")
# Which fla ran a kernel-fla row: its guards (float32, the layout) are read from the installed kernel, which changes
# between releases.
FLA_VERSION = ExtraSpec("fla_version", str, "", "kernel fla: the version of the flash-linear-attention that ran")


# ---------------------------------------------------------------------------------------------------- shared options
def form_option(trains: str) -> OptionSpec:
    return OptionSpec(
        "form",
        str,
        "chunked",
        f"chunked: the chunkwise-parallel form (WY/UT: matrix products and a triangular solve inside chunks, the "
        f"recurrence across them; how {trains} trains); recurrent: one token at a time (how it decodes)",
        choices=FORMS,
    )


def chunk_option(maximum: int = 65_536, why: str = "") -> OptionSpec:
    return OptionSpec("chunk", int, 64, "tokens per chunk of the chunked form" + why, minimum=1, maximum=maximum)


def kernel_option(function: str) -> OptionSpec:
    return OptionSpec(
        "kernel",
        str,
        "torch",
        f"torch: the plain-torch forms (every device); fla: the chunked form as flash-linear-attention's fused Triton "
        f"kernel ({function}; CUDA, when the fla package is installed: an unsupported row otherwise)",
        choices=("torch", "fla"),
    )


NETWORK = (
    shared.SCOPE,
    shared.VOCAB,
    shared.positional(rope=False),
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)


def _options(gated: bool) -> tuple[OptionSpec, ...]:
    name = "Gated DeltaNet" if gated else "DeltaNet"
    return (
        form_option(name),
        chunk_option(),
        kernel_option("chunk_gated_delta_rule" if gated else "chunk_delta_rule"),
        OptionSpec("head_dim", int, 0, "d_k: key width per head; 0 = d_model / heads", minimum=0, maximum=4096),
        OptionSpec("expand_v", int, 2 if gated else 1, "d_v = expand_v × d_k (fla's expand_v)", minimum=1, maximum=16),
        OptionSpec(
            "heads_v",
            int,
            0,
            "value heads, each reading the key head it is grouped with (fla's num_v_heads; Qwen3-Next: 32 value "
            "heads on 16 key heads); 0 = heads",
            minimum=0,
            maximum=4096,
        ),
        OptionSpec("d_conv", int, 4, "taps of the causal depthwise conv over q, k, v", minimum=1, maximum=64),
        OptionSpec(
            "output_gate",
            bool,
            gated,
            "the norm's output times SiLU of a gate projected from the input (fla's use_gate)",
        ),
        *NETWORK,
    )


def kernel_no_effect(name: str, value_of: ValueOf) -> Problem | None:
    """``chunk`` sizes the torch chunked form only (fla's kernels choose their own); ``kernel`` is the chunked
    form's."""
    if name == "chunk" and (value_of("form") != "chunked" or value_of("kernel") == "fla"):
        return Problem(
            "chunk sizes the chunks of form chunked only (fla's kernel chooses its own)",
            name,
            "remove chunk, or use form: chunked with kernel: torch",
        )
    if name == "kernel" and value_of("form") != "chunked":
        return Problem(
            "kernel fla is the chunked form's kernel; the recurrent form is plain torch",
            name,
            "use form: chunked, or remove kernel",
        )
    return shared.network_no_effect(name, value_of, recurrent=True)


def heads_problem(case: Case, head_dim: int | None) -> Problem | None:
    """Every head gets d_model / heads (where ``head_dim`` is 0, or where the model has no such option: None), which
    must be whole."""
    heads = case.heads or 0
    if head_dim or (heads and case.d_model % heads == 0):
        return None
    return Problem(
        f"heads {heads} does not divide d_model {case.d_model}: each head gets d_model / heads",
        None if head_dim is None else "head_dim",
        "choose heads that divide d_model" + ("" if head_dim is None else ", or set head_dim"),
    )


# ---------------------------------------------------------------------------------------------------- counting
def chunked(length: int, chunk: int, per_chunk: Callable[[int], tuple[int, int]]) -> tuple[int, int]:
    """(products, solve) summed over the T // C whole chunks and the last chunk of T mod C tokens, each at its own
    length (the torch form computes the last at its true length, unpadded)."""
    whole, tail = divmod(length, chunk)
    products, solve = (whole * part for part in per_chunk(chunk))
    if tail:
        rest = per_chunk(tail)
        products, solve = products + rest[0], solve + rest[1]
    return products, solve


def solve_flops(c: int, d_k: int, d_v: int) -> int:
    """Forward substitution with a c × c unit-lower-triangular matrix: c(c − 1)/2 multiply-adds per right-hand
    side, d_k + d_v of them."""
    return c * (c - 1) * (d_k + d_v)


def state_dtype(case: Case) -> str:
    """The matrix memory's dtype: float32 for 16-bit models (the cores accumulate in it, as fla's kernels do)."""
    return shared.kept(case, "float32" if shared.DTYPE_BYTES[case.dtype] < 4 else case.dtype)


def form_of(case: Case, option: str) -> str:
    """A decode step is one step of the recurrence, whatever form filled the state."""
    return "recurrent" if case.mode == "decode" else option


class DeltaNetFamily(Family):
    name = "deltanet"
    order = 26
    models = (
        ModelSpec(
            GATED,
            "recurrent",
            "deltanet",
            "Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464): the delta rule with a Mamba-2 decay, "
            "trained by the chunked WY/UT form, decoded as an RNN from an (H, d_k, d_v) state",
            options=_options(gated=True),
            heads=True,
        ),
        ModelSpec(
            PLAIN,
            "recurrent",
            "deltanet",
            "DeltaNet (Schlag et al. 2021; Yang et al. 2024, arXiv:2406.06484): a matrix memory written by the delta "
            "rule, trained by the chunked WY/UT form, decoded as an RNN from an (H, d_k, d_v) state",
            options=_options(gated=False),
            heads=True,
        ),
    )
    # A decode step is one step of the recurrence, whatever form (and kernel) filled the state.
    decode_inert = frozenset({"form", "chunk", "kernel"})
    packages = (FLA,)
    extras = (FLA_VERSION,)
    # claim_role: none. Trained by its chunked (parallel) form it is neither the RNN the article's claims are about
    # nor its attention: compared in its own right, as Mamba-2 is.

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return kernel_no_effect(name, value_of)

    def cannot_build(self, case: Case) -> Problem | None:
        heads, value_heads = case.heads or 0, self.value_heads(case)
        if heads and value_heads % heads:
            return Problem(
                f"heads_v {value_heads} is not a multiple of heads {heads}: each key head serves heads_v / heads "
                "value heads",
                "heads_v",
                f"give heads_v a multiple of {heads}, or 0 (= heads)",
            )
        return heads_problem(case, int(self.option(case, "head_dim"))) or shared.network_cannot_build(
            case, self.values(case)
        )

    def value_heads(self, case: Case) -> int:
        """H_v: the heads the rule runs on (each with its own β, decay and memory); the key heads' q and k are read
        by heads_v / heads of them each."""
        return int(self.option(case, "heads_v")) or (case.heads or 0)

    # ------------------------------------------------------------------------------------------------ sizes
    def head_dims(self, case: Case) -> tuple[int, int]:
        """(d_k, d_v) of every head."""
        d_k = int(self.option(case, "head_dim")) or case.d_model // (case.heads or 1)
        return d_k, d_k * int(self.option(case, "expand_v"))

    def projected(self, case: Case) -> int:
        """Width of the input projection: q, k, v, β, the decay's input (gated) and the output gate (where on)."""
        heads, value_heads, (d_k, d_v) = case.heads or 0, self.value_heads(case), self.head_dims(case)
        gated, gate = case.model == GATED, bool(self.option(case, "output_gate"))
        return 2 * heads * d_k + value_heads * (d_v + 1 + gated + d_v * gate)

    def conv_dim(self, case: Case) -> int:
        heads, (d_k, d_v) = case.heads or 0, self.head_dims(case)
        return 2 * heads * d_k + self.value_heads(case) * d_v

    def layer_parameters(self, case: Case) -> int:
        d, heads, (_, d_v) = case.d_model, self.value_heads(case), self.head_dims(case)
        decay = 2 * heads if case.model == GATED else 0  # A_log, dt_bias
        conv = self.conv_dim(case) * int(self.option(case, "d_conv"))
        return d * self.projected(case) + conv + decay + d_v + heads * d_v * d

    def parameters(self, case: Case) -> int:
        block = self.layer_parameters(case) + (2 * case.d_model if self.option(case, "scope") != "core" else 0)
        return shared.network_parameters(case, self.values(case), case.layers * block)

    # ------------------------------------------------------------------------------------------------ work
    def formula(self, case: Case) -> str:
        form = form_of(case, str(self.option(case, "form")))
        stem = shared.scope_stem(self.values(case), f"{case.model}-{form}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def core_flops(self, case: Case) -> tuple[int, int]:
        """(products, solve) of the rule in one layer over one call, every head and sequence (module notes)."""
        t, (d_k, d_v) = shared.call_tokens(case), self.head_dims(case)
        scale = case.batch * self.value_heads(case)  # the rule runs per value head, on its key head's q and k
        if form_of(case, str(self.option(case, "form"))) == "recurrent":
            return scale * t * 6 * d_k * d_v, 0

        def per_chunk(c: int) -> tuple[int, int]:
            return 4 * c * c * d_k + 2 * c * c * d_v + 6 * c * d_k * d_v, solve_flops(c, d_k, d_v)

        products, solve = chunked(t, int(self.option(case, "chunk")), per_chunk)
        return scale * products, scale * solve

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        tokens, d, heads = case.batch * shared.call_tokens(case), case.d_model, self.value_heads(case)
        projections = 2 * tokens * d * self.projected(case) + 2 * tokens * heads * self.head_dims(case)[1] * d
        core, solve = self.core_flops(case)
        forward = {"projections": case.layers * projections, "core": case.layers * core}
        if solve:
            forward["solve"] = case.layers * solve
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    # ------------------------------------------------------------------------------------------------ decode
    def state_dtype(self, case: Case) -> str:
        return state_dtype(case)

    def state_bytes(self, case: Case) -> int:
        heads, (d_k, d_v) = self.value_heads(case), self.head_dims(case)
        conv = (
            (int(self.option(case, "d_conv")) - 1)
            * self.conv_dim(case)
            * shared.DTYPE_BYTES[shared.kept(case, case.dtype)]
        )
        matrix = heads * d_k * d_v * shared.DTYPE_BYTES[self.state_dtype(case)]
        return case.layers * case.batch * (conv + matrix)

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"


FAMILY = DeltaNetFamily()
