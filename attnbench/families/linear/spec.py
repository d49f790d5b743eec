"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), torch-free: names, options, sizes,
FLOPs, decode state. The torch half is ``attnbench.families.linear.layers``.

It joins the recurrent side of the article's claims: it trains in parallel (its ``form``) and decodes as an RNN
with a d×d state per head. Its projections are attention's; its core, per form (one layer):

- recurrent (and a decode step, which is one of its steps): per query head the readout φ(q)ᵀ[S z] is a D × (D + 1)
  product, and per key/value head the state update φ(k)[vᵀ 1] one outer product of the same size (the normaliser z
  rides along as an extra value column): per token 2·H·D·(D+1) + 2·H_kv·D·(D+1).
- parallel: QKᵀ and P·V over the causal pairs, 4·H·D per pair as softmax attention's core; ``full_scores``: all T²
  (it computes the whole matrix and masks it).
- chunked with C: the parallel form inside each of T/C chunks (C(C+1)/2 pairs kept: counted kept), the readout from
  each chunk's start state (2·H·D·(D+1) per token) and each chunk's state update (2·H_kv·D·(D+1) per token).

Every core matmul's backward is twice its forward. The state, S (D × D) and z (D) per key/value head, layer and
sequence, is kept in float32 for 16-bit models (its accumulation dtype): constant in n.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnbench.core.cases import Case, Options
from attnbench.families import shared
from attnbench.families.base import ExtraValue, Family, ModelSpec, OptionSpec, Package, Parts, Problem, ValueOf

FORMS: tuple[str, ...] = ("chunked", "recurrent", "parallel")
_OPTIONS = (
    OptionSpec(
        "form",
        str,
        "chunked",
        "chunked: the parallel form inside chunks, a state carried across them (the training form of fla, GLA, "
        "RetNet); recurrent: one step at a time with a d×d state; parallel: the quadratic masked form",
        choices=FORMS,
    ),
    OptionSpec("chunk", int, 64, "tokens per chunk of the chunked form", minimum=1, maximum=65_536),
    OptionSpec(
        "kernel",
        str,
        "torch",
        "torch: the plain-torch forms (every device); fla: the chunked form as flash-linear-attention's fused Triton "
        "kernel (chunk_linear_attn; CUDA, when the fla package is installed: an unsupported row otherwise)",
        choices=("torch", "fla"),
    ),
    OptionSpec(
        "feature",
        str,
        "elu",
        "feature map φ: elu (elu + 1, Katharopoulos et al. 2020) or relu",
        choices=("elu", "relu"),
    ),
    OptionSpec(
        "decay",
        str,
        "none",
        "none, or retnet: a fixed per-head decay γ_h = 1 − 2^(−5−h) of the state (Sun et al. 2023, RetNet)",
        choices=("none", "retnet"),
    ),
    shared.HEADS_KV,
    shared.SCOPE,
    shared.FFN_MULT,
    shared.VOCAB,
    shared.positional(rope=False),
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)


class LinearFamily(Family):
    name = "linear"
    order = 30
    models = (
        ModelSpec(
            "linear-attn",
            "recurrent",
            "linear",
            "causal linear attention (Katharopoulos et al. 2020, 'Transformers are RNNs'): φ(q)ᵀS_t with a d×d "
            "state per head; trains in parallel (form), decodes as an RNN",
            options=_OPTIONS,
            heads=True,
        ),
    )
    extras = (shared.GQA_PATH,)
    packages = (Package("flash-linear-attention", "fla"),)
    case_columns = (shared.HEADS_KV_COLUMN,)
    # A decode step is one step of the recurrent form, whatever form filled the state.
    decode_inert = frozenset({"form", "chunk"})

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        if name == "chunk" and (value_of("form") != "chunked" or value_of("kernel") == "fla"):
            return Problem(
                "chunk sizes the chunks of form chunked only (fla's kernel chooses its own)",
                name,
                "remove chunk, or use form: chunked with kernel: torch",
            )
        if name == "kernel" and value_of("form") != "chunked":
            return Problem(
                "kernel fla is the chunked form's kernel; the recurrent and parallel forms are plain torch",
                name,
                "use form: chunked, or remove kernel",
            )
        return shared.network_no_effect(name, value_of, recurrent=False)

    def cannot_build(self, case: Case) -> Problem | None:
        opt = self.values(case)
        return shared.heads_cannot_build(case, opt) or shared.network_cannot_build(case, opt)

    def canonical(self, spec: ModelSpec, options: Options, heads: int) -> Options:
        return shared.without_full_heads_kv(options, heads)

    def kv_heads(self, case: Case) -> int:
        """Key/value heads: ``heads`` for multi-head attention, fewer for GQA, 1 for MQA."""
        return shared.kv_heads(case, self.values(case))

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        return {"heads_kv": shared.kv_heads(case, self.values(case))}

    def _form(self, case: Case) -> str:
        return "recurrent" if case.mode == "decode" else str(self.option(case, "form"))

    def formula(self, case: Case) -> str:
        # A decode step is the recurrent form's step whatever form computed the context.
        stem = shared.scope_stem(self.values(case), f"linear-attn-{self._form(case)}")
        return shared.versioned(stem, shared.DECODE_SUFFIX * (case.mode == "decode"))

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        b, t = case.batch, shared.call_tokens(case)
        opt = self.values(case)
        heads, kv = case.heads or 0, shared.kv_heads(case, opt)
        d = case.d_model // heads
        readout, update = 2 * b * t * heads * d * (d + 1), 2 * b * t * kv * d * (d + 1)
        form = self._form(case)
        if form == "recurrent":
            core = readout + update
        elif form == "parallel":
            pairs = t * t if full_scores else shared.causal_pairs(t, t)
            core = 4 * b * heads * d * pairs
        else:
            chunk = int(opt("chunk"))
            full, rest = divmod(t, chunk)
            pairs = full * shared.causal_pairs(chunk, chunk)
            core = 4 * b * heads * d * (pairs + shared.causal_pairs(rest, rest)) + readout + update
        return shared.attention_like_work(case, opt, core, (shared.MATMUL_BACKWARD, 1))

    def scores_in_full(self, case: Case, extra: Mapping[str, object]) -> bool:
        """The parallel form computes the whole T × T score matrix and masks it after."""
        return self.option(case, "form") == "parallel" and case.mode != "decode"

    def parameters(self, case: Case) -> int:
        opt = self.values(case)
        return shared.network_parameters(case, opt, case.layers * shared.attention_layer_parameters(case, opt))

    def state_dtype(self, case: Case) -> str:
        return shared.kept(case, "float32" if shared.DTYPE_BYTES[case.dtype] < 4 else case.dtype)

    def state_bytes(self, case: Case) -> int:
        head_dim = case.d_model // (case.heads or 1)
        element = shared.DTYPE_BYTES[self.state_dtype(case)]
        kv = shared.kv_heads(case, self.values(case))
        return case.layers * case.batch * kv * (head_dim * head_dim + head_dim) * element

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"

    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        return shared.embedding_table(case, self.values(case))

    def intermediate_elements(self, case: Case) -> int:
        return shared.attention_like_intermediates(case, self.values(case))


FAMILY = LinearFamily()
