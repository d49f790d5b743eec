"""Published models' token mixers at their real dimensions (issue 49), as data: each with its source, the fields of
its model card's ``config.json`` the numbers come from (cited, never downloaded), its mixers (a built-in model, its
heads and options) and the order its layers take them in. Torch-free and free of imports from the families, so that
every family's ``preset`` option can list these names (``shared.preset``) and the catalogue can loop over them.

A preset is measured at one of three scopes (``presets.scope`` in a config): ``core`` (the default) and ``block``
case each distinct mixer once, one layer of it (the token mixer with its projections, gates, convolutions and
norms; a block adds attnbench's pre-norm and, after attention, its dense FFN of ``ffn_mult`` × d_model), which is
what a crossover between a model's own recurrent and attention mixers compares; ``model`` cases the whole stack of
the published layer count (token embedding of the published vocabulary in front). What is never built: the
published FFNs and mixtures of experts (SwiGLU, MoE: their size is the model's, their cost is not the token mixer's),
rotary positions (parameter-free) and, where a mixer says so in ``differs``, the few parameters a family lays out
otherwise.

An attention mixer's ``model`` is None: it is built on the config's ``presets.core`` (sdpa by default), as bert-base
is. A mixer whose model is not in this build's catalogue (``kda``, ``mla`` and the ``sinks`` option come with their
families) leaves its preset listed but refused at validation, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.core.cases import PARALLEL

OptionValue = str | int | float | bool

__all__ = ["PUBLISHED", "PUBLISHED_NAMES", "Mixer", "Published"]


@dataclass(frozen=True)
class Mixer:
    """One kind of token-mixing layer of a published model."""

    label: str  # what the model's own config calls it: "attention", "linear_attention", "sliding_attention", …
    model: str | None  # the built-in model; None: the config's presets.core (an attention core)
    heads: int | None
    options: tuple[tuple[str, OptionValue], ...]  # sorted by name, as a Case keeps them
    recurrent: bool  # which side of the model's own crossover it stands on
    differs: str = ""  # where the family's layer differs from the published one, in words ("" = not at all)


@dataclass(frozen=True)
class Published:
    """A published model: its mixers, their order, its size and where every number comes from."""

    name: str
    summary: str
    source: str  # the model card whose config.json the fields are read from
    fields: str  # the config.json fields cited, as published
    d_model: int
    layers: int  # token-mixer layers (Nemotron-H's MLP-only layers are not mixers)
    vocab: int
    mixers: tuple[Mixer, ...]
    # The mixer labels of one cycle of layers, repeated to ``layers`` (a whole stack where it is not periodic).
    pattern: tuple[str, ...]
    left_out: str  # what the preset does not build, below scope block and above

    def mixer(self, label: str) -> Mixer:
        return next(m for m in self.mixers if m.label == label)

    def count(self, label: str) -> int:
        """How many of the ``layers`` layers run mixer ``label``, alone or side by side with another (``a+b``)."""
        return sum(self.pattern[i % len(self.pattern)].split(PARALLEL).count(label) for i in range(self.layers))


def _options(**options: OptionValue) -> tuple[tuple[str, OptionValue], ...]:
    return tuple(sorted(options.items()))


# Scope block and model put attnbench's dense FFN after attention mixers only (module notes).
_MOE = "the SwiGLU FFN / MoE after every mixer"
_NEMOTRON_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_KIMI_FULL = (4, 8, 12, 16, 20, 24, 27)  # 1-based, as linear_attn_config.full_attn_layers lists them

PUBLISHED_MODELS: tuple[Published, ...] = (
    Published(
        "llama3.1-8b",
        "Llama-3.1-8B: 32 layers of grouped-query attention (32 query heads, 8 key/value heads of 128)",
        "huggingface.co/meta-llama/Llama-3.1-8B config.json",
        "hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128, attention_bias false, "
        "num_hidden_layers 32, vocab_size 128256, intermediate_size 14336",
        4096,
        32,
        128256,
        (Mixer("attention", None, 32, _options(bias=False, heads_kv=8), recurrent=False),),
        ("attention",),
        "the SwiGLU FFN (intermediate_size 14336) and rotary positions",
    ),
    Published(
        "qwen3-next-80b-a3b",
        "Qwen3-Next-80B-A3B: 48 layers, three Gated DeltaNet to one gated attention (full_attention_interval 4)",
        "huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json",
        "hidden_size 2048, num_hidden_layers 48, full_attention_interval 4, num_attention_heads 16, "
        "num_key_value_heads 2, head_dim 256, linear_num_key_heads 16, linear_num_value_heads 32, "
        "linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4, vocab_size 151936 "
        "(attention: q_proj 2·16·256 wide with its output gate, q_norm and k_norm of 256, no biases)",
        2048,
        48,
        151936,
        (
            Mixer(
                "linear_attention",
                "gated-deltanet",
                16,
                _options(d_conv=4, expand_v=1, head_dim=128, heads_v=32),
                recurrent=True,
            ),
            Mixer(
                "full_attention",
                None,
                16,
                _options(bias=False, head_dim=256, heads_kv=2, output_gate=True, qk_norm=True),
                recurrent=False,
            ),
        ),
        ("linear_attention", "linear_attention", "linear_attention", "full_attention"),
        _MOE + " (512 experts of moe_intermediate_size 512, 10 routed + 1 shared) and rotary positions",
    ),
    Published(
        "kimi-linear-48b-a3b",
        "Kimi-Linear-48B-A3B: 27 layers, Kimi Delta Attention with MLA at every fourth and the last (3:1)",
        "huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct config.json",
        "hidden_size 2304, num_hidden_layers 27, num_attention_heads 32, q_lora_rank null, kv_lora_rank 512, "
        "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, mla_use_nope true, linear_attn_config: "
        "num_heads 32, head_dim 128, short_conv_kernel_size 4, full_attn_layers [4, 8, 12, 16, 20, 24, 27], "
        "vocab_size 163840",
        2304,
        27,
        163840,
        (
            Mixer("kda", "kda", 32, _options(d_conv=4, expand_v=1, head_dim=128), recurrent=True),
            Mixer(
                "mla",
                "mla",
                32,
                _options(kv_lora_rank=512, q_lora_rank=0, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
                recurrent=False,
            ),
        ),
        tuple("mla" if i + 1 in _KIMI_FULL else "kda" for i in range(27)),
        _MOE + " (256 experts of moe_intermediate_size 1024, 8 routed + 1 shared)",
    ),
    Published(
        "nemotron-h-8b",
        "Nemotron-H-8B: 24 Mamba-2 and 4 attention layers (besides 24 MLP-only layers)",
        "huggingface.co/nvidia/Nemotron-H-8B-Base-8K config.json",
        f"hidden_size 4096, num_hidden_layers 52, hybrid_override_pattern {_NEMOTRON_PATTERN} (M Mamba-2, * "
        "attention, - MLP), num_attention_heads 32, num_key_value_heads 8, head_dim 128, attention_bias false, "
        "mamba_num_heads 128, mamba_head_dim 64, n_groups 8, ssm_state_size 128, conv_kernel 4, chunk_size 128, "
        "expand 2, use_conv_bias true, mamba_proj_bias false, vocab_size 131072",
        4096,
        28,
        131072,
        (
            Mixer(
                "M",
                "mamba2",
                None,
                _options(chunk=128, d_conv=4, d_state=128, expand=2, groups=8, head_dim=64),
                recurrent=True,
            ),
            Mixer("*", None, 32, _options(bias=False, heads_kv=8), recurrent=False),
        ),
        tuple(c for c in _NEMOTRON_PATTERN if c != "-"),
        "the 24 MLP-only layers (squared-ReLU, intermediate_size 21504): its 28 mixer layers are the stack",
    ),
    Published(
        "falcon-h1-7b",
        "Falcon-H1-7B: 44 layers, each attention and Mamba-2 side by side on the same input (a parallel hybrid)",
        "huggingface.co/tiiuae/Falcon-H1-7B-Base config.json",
        "hidden_size 3072, num_hidden_layers 44, num_attention_heads 12, num_key_value_heads 2, head_dim 128, "
        "mamba_d_ssm 3072, mamba_n_heads 24, mamba_d_head 128, mamba_d_state 256, mamba_n_groups 1, mamba_d_conv 4, "
        "mamba_chunk_size 128, vocab_size 130048",
        3072,
        44,
        130048,
        (
            Mixer("attention", None, 12, _options(bias=False, head_dim=128, heads_kv=2), recurrent=False),
            Mixer(
                "mamba",
                "mamba2",
                None,
                _options(chunk=128, d_conv=4, d_state=256, expand=1, groups=1, head_dim=128),
                recurrent=True,
                differs="the mamba2 family's gated RMSNorm (3072 weights) is counted whether or not the release "
                "sets mamba_rms_norm",
            ),
        ),
        ("attention+mamba",),
        "the SwiGLU FFN (intermediate_size 12288) and the µP multipliers (scalars)",
    ),
    Published(
        "gpt-oss-20b",
        "gpt-oss-20b: 24 layers alternating sliding-window (128) and full attention, each with learned sinks",
        "huggingface.co/openai/gpt-oss-20b config.json",
        "hidden_size 2880, num_hidden_layers 24, num_attention_heads 64, num_key_value_heads 8, head_dim 64, "
        "sliding_window 128, layer_types [sliding_attention, full_attention, …], attention_bias true, "
        "vocab_size 201088",
        2880,
        24,
        201088,
        (
            Mixer(
                "sliding_attention",
                None,
                64,
                _options(head_dim=64, heads_kv=8, sinks=True, window=128),
                recurrent=False,
            ),
            Mixer("full_attention", None, 64, _options(head_dim=64, heads_kv=8, sinks=True), recurrent=False),
        ),
        ("sliding_attention", "full_attention"),
        _MOE + " (32 experts, 4 routed) and rotary positions",
    ),
    Published(
        "mamba2-2.7b",
        "Mamba-2 2.7B: 64 Mamba-2 layers",
        "huggingface.co/state-spaces/mamba2-2.7b config.json (with mamba_ssm.modules.mamba2.Mamba2's defaults)",
        "d_model 2560, n_layer 64, d_intermediate 0, vocab_size 50277, ssm_cfg {layer: Mamba2}: d_state 128, "
        "d_conv 4, expand 2, headdim 64, ngroups 1, chunk_size 256",
        2560,
        64,
        50277,
        (
            Mixer(
                "Mamba2",
                "mamba2",
                None,
                _options(chunk=256, d_conv=4, d_state=128, expand=2, groups=1, head_dim=64),
                recurrent=True,
            ),
        ),
        ("Mamba2",),
        "nothing but its RMSNorms' layout (the family's blocks take a LayerNorm: 2·d_model, not d_model)",
    ),
    Published(
        "deepseek-v3",
        "DeepSeek-V3: 61 layers of multi-head latent attention (a 512 + 64 latent cached per token)",
        "huggingface.co/deepseek-ai/DeepSeek-V3 config.json",
        "hidden_size 7168, num_hidden_layers 61, num_attention_heads 128, q_lora_rank 1536, kv_lora_rank 512, "
        "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, vocab_size 129280",
        7168,
        61,
        129280,
        (
            Mixer(
                "attention",
                "mla",
                128,
                _options(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
                recurrent=False,
            ),
        ),
        ("attention",),
        _MOE + " (256 experts of moe_intermediate_size 2048, 8 routed + 1 shared; the first 3 layers dense)",
    ),
    Published(
        "rwkv7-2.9b",
        "RWKV-7 World3 2.9B: 32 RWKV-7 time-mix layers (40 heads of 64)",
        "huggingface.co/RWKV/RWKV7-Goose-World3-2.9B-HF config.json",
        "hidden_size 2560, num_hidden_layers 32, head_size 64 (40 heads), decay_low_rank_dim 96, "
        "a_low_rank_dim 96, gate_low_rank_dim 320, v_low_rank_dim 64, vocab_size 65536",
        2560,
        32,
        65536,
        (
            Mixer(
                "time_mix",
                "rwkv7",
                40,
                _options(a_rank=96, decay_rank=96, gate_rank=320),
                recurrent=True,
                differs="the first layer's: the value-residual LoRA of the 31 later layers (2·2560·64 + 2560) is "
                "not built",
            ),
        ),
        ("time_mix",),
        "the channel-mix FFN (intermediate_size 10240)",
    ),
)
PUBLISHED: dict[str, Published] = {p.name: p for p in PUBLISHED_MODELS}
PUBLISHED_NAMES: tuple[str, ...] = tuple(PUBLISHED)
