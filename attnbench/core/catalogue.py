"""Every model name attnbench knows, as plain data.

Torch-free on purpose: ``validate``, ``report`` and ``compare`` must know every registry name and option without
importing torch. ``attnbench.measure.models`` supplies a builder for each entry; a test holds the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Family = Literal["recurrent", "attention"]
OptionType = type[bool] | type[int] | type[float] | type[str]


@dataclass(frozen=True)
class OptionSpec:
    """One model option a config may set under ``model_options.<model>``.

    ``choices`` closes the set of values a string option takes; ``minimum``/``maximum`` bound an integer one.
    Config validation enforces both; a stored row is only type-checked, so that a later release may add a
    choice without making older results unreadable.
    """

    name: str
    type: OptionType
    default: bool | int | float | str
    help: str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: Family
    summary: str
    # Devices the kernel exists for at all; finer limits (dtype, head dim) are found by probing a tiny input.
    devices: tuple[str, ...] = ("cpu", "cuda")
    # A Python package the model needs beyond torch (import name).
    package: str | None = None
    options: tuple[OptionSpec, ...] = ()

    def option(self, name: str) -> OptionSpec | None:
        return next((o for o in self.options if o.name == name), None)


@dataclass(frozen=True)
class Preset:
    """A model of fixed, published size, cased beside the grid by a config's top-level ``presets`` key.

    The case it becomes carries every size in its own fields and options (``preset`` among them, so a row
    says which preset it is); builders never look a preset up.
    """

    name: str
    family: Family
    summary: str
    model: str | None  # the one model it is built from; None: any attention model (the config's presets.core)
    d_model: int
    heads: int | None
    layers: int
    options: tuple[tuple[str, bool | int | float | str], ...]  # sorted by name, as Case keeps them
    max_seq_len: int | None = None  # learned positions cover this many tokens
    reference: str = ""


SCOPES: tuple[str, ...] = ("core", "block", "model")
POSITIONAL: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope")
# BERT's WordPiece vocabulary (Devlin et al. 2019; bert-base-uncased's vocab_size).
BERT_VOCAB = 30522
# Matched-parameter recurrent blocks land within this fraction of the attention block they stand in for.
MATCH_TOLERANCE = 0.01

_SCOPE = OptionSpec(
    "scope",
    str,
    "core",
    "core: the layer alone (projections + attention core, or the recurrent layer); block: a pre-norm block "
    "(LayerNorm, the layer, residual; attention adds the FFN); model: token embedding + positions + `layers` "
    "blocks + final LayerNorm, fed int64 token ids",
    choices=SCOPES,
)
_FFN_MULT = OptionSpec(
    "ffn_mult",
    int,
    4,
    "FFN width as a multiple of d_model (BERT: 3072 = 4 x 768); for recurrent blocks with match: params, the "
    "attention block whose size is matched",
    minimum=1,
    maximum=64,
)
_VOCAB = OptionSpec("vocab", int, BERT_VOCAB, "token embedding rows at scope model", minimum=2, maximum=4_194_304)
_MAX_LEN = OptionSpec(
    "max_len",
    int,
    0,
    "positions the learned table covers; 0 = the case's seq_len (BERT-base: 512)",
    minimum=0,
    maximum=2**22,
)
_PRESET_HELP = "set by the config's top-level presets key, never under model_options; recorded so a row names it"


def _positional(*choices: str) -> OptionSpec:
    return OptionSpec(
        "positional",
        str,
        "none",
        "positional encoding: none, sinusoidal (Vaswani et al. 2017 §3.5) or learned (BERT) added to the "
        "input" + (", rope (rotary, Su et al. 2021) on queries and keys in every layer" if "rope" in choices else ""),
        choices=choices,
    )


def _preset(*names: str) -> OptionSpec:
    return OptionSpec("preset", str, "none", _PRESET_HELP, choices=("none", *names))


_MATCH = OptionSpec(
    "match",
    str,
    "hidden",
    "at scope block/model: hidden = d_model, or params: hidden chosen so a block has the parameters of the "
    "attention block of the same d_model and ffn_mult (within 1 %), with a Linear back to d_model",
    choices=("hidden", "params"),
)
_ATTENTION_OPTIONS = (_SCOPE, _FFN_MULT, _VOCAB, _positional(*POSITIONAL), _MAX_LEN, _preset("bert-base"))


def _recurrent_options(model: str) -> tuple[OptionSpec, ...]:
    first: tuple[OptionSpec, ...]
    if model in ("lstm", "gru"):
        first = (
            OptionSpec(
                "bidirectional",
                bool,
                False,
                "run both directions; each gets half the hidden units, so the output width stays d_model",
            ),
        )
    else:
        first = (
            OptionSpec(
                "scan",
                str,
                "parallel",
                "parallel: log-space scan over the whole sequence (Heinsen 2023, cumsum + logcumsumexp); "
                "sequential: the recurrence one step at a time",
                choices=("parallel", "sequential"),
            ),
        )
    presets = tuple(name for name, preset in PRESETS.items() if preset.model == model)
    return (
        *first,
        _SCOPE,
        _MATCH,
        _FFN_MULT,
        _VOCAB,
        _positional("none", "sinusoidal", "learned"),
        _MAX_LEN,
        _preset(*presets),
    )


_BERT_REFERENCE = (
    "Devlin et al. 2019 (arXiv:1810.04805) §3: L=12, H=768, A=12, 110M parameters; bert-base-uncased: "
    "vocab 30522, intermediate 3072, 512 positions"
)
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
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
        Preset(
            "lstm-110m",
            "recurrent",
            "BERT-base with each encoder block swapped for an LSTM block of the same parameter count: vocab 30522 "
            "embedding, 12 x (LayerNorm, LSTM hidden 936, Linear to 768, residual), final LayerNorm (108.7 M)",
            "lstm",
            768,
            None,
            12,
            (("match", "params"), ("preset", "lstm-110m"), ("scope", "model")),
        ),
        Preset(
            "mingru-110m",
            "recurrent",
            "as lstm-110m with minGRU blocks (hidden 3072, parallel scan): the parallel RNN at BERT-base's size "
            "(108.5 M)",
            "mingru",
            768,
            None,
            12,
            (("match", "params"), ("preset", "mingru-110m"), ("scope", "model")),
        ),
    )
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)

_ATTENTION_MODELS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
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
)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "lstm",
            "recurrent",
            "torch.nn.LSTM, hidden = d_model (cuDNN on GPU, oneDNN/native on CPU)",
            options=_recurrent_options("lstm"),
        ),
        ModelSpec(
            "gru",
            "recurrent",
            "torch.nn.GRU, hidden = d_model (cuDNN on GPU, oneDNN/native on CPU)",
            options=_recurrent_options("gru"),
        ),
        ModelSpec(
            "mingru",
            "recurrent",
            "minGRU (Feng et al. 2024, arXiv:2410.01201): gates from x_t alone, so the recurrence is a parallel scan",
            options=_recurrent_options("mingru"),
        ),
        ModelSpec(
            "minlstm",
            "recurrent",
            "minLSTM (Feng et al. 2024): normalised forget/input gates from x_t alone, parallel scan",
            options=_recurrent_options("minlstm"),
        ),
        *(
            ModelSpec(name, "attention", summary, devices=devices, package=package, options=_ATTENTION_OPTIONS)
            for name, summary, devices, package in _ATTENTION_MODELS
        ),
    )
}

MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
# What a config or --device may ask for, and what a resolved case records.
DEVICE_REQUEST = re.compile(r"auto|cpu|cuda|cuda:\d+")
RESOLVED_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
# backward = the backward pass alone (graph kept, grads cleared), so train can be checked against forward + backward.
# decode = one new token per sequence with a context of seq_len tokens already in the KV cache or recurrent state.
MODES: tuple[str, ...] = ("forward", "train", "backward", "decode")
# Options that change only how the whole sequence is computed, so a decode step is the same whatever their value
# (minGRU/minLSTM decode by the recurrence's single step; the scan only fills the state, outside the timing):
# decode cases leave them out, so that two values do not time one step twice.
DECODE_INERT: tuple[str, ...] = ("scan",)


def is_recurrent(model: str) -> bool:
    return MODELS[model].family == "recurrent"


def decode_problem(model: str, causal: bool) -> str | None:
    """Why a ``model`` case with this ``causal`` cannot decode, or None. A new token may see only the tokens
    before it: attention must be causal, a recurrence unidirectional (``causal`` is False when bidirectional)."""
    if causal:
        return None
    if is_recurrent(model):
        return (
            f"a bidirectional {model} reads the sequence backwards too, so it cannot produce one token at a time "
            "(decode needs bidirectional: false)"
        )
    return (
        f"{model} with causal=false lets every position see the whole sequence, so it cannot produce one token "
        "at a time (decode needs causal attention)"
    )


def option_problem(model: str, name: str, options: dict[str, bool | int | float | str]) -> str | None:
    """None if option ``name`` changes what ``model`` computes given its other ``options``, else why not.

    Config validation drops an option from the cases where it has no effect (so a case's key never carries a
    setting that changed nothing), and refuses one that has no effect anywhere it is given.
    """
    spec = MODELS[model]

    def value(key: str) -> bool | int | float | str:
        option = spec.option(key)
        return options.get(key, option.default if option is not None else "")

    scope = value("scope")
    if name == "vocab" and scope != "model":
        return "vocab sizes the token embedding, which exists at scope model only"
    if name == "max_len" and value("positional") != "learned":
        return "max_len sizes the learned position table, which exists with positional: learned only"
    if name == "match" and scope == "core":
        return "match sizes the recurrent block; at scope core the layer has hidden = d_model"
    if name == "ffn_mult":
        if spec.family == "attention" and scope == "core":
            return "ffn_mult sizes the FFN of a block; scope core has none"
        if spec.family == "recurrent" and (scope == "core" or value("match") != "params"):
            return "ffn_mult sizes the attention block a recurrent block matches, so needs match: params"
    return None
