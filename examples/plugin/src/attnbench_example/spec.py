"""What the entry points name: torch-free descriptions, so `attnbench validate` and `attnbench models` never import
torch for them. The factories they name live in ``layers``."""

from attnbench.plugin import ModelPlugin, Option

GATED_RECURRENCE = ModelPlugin(
    factory="attnbench_example.layers:gated_recurrence",
    kind="recurrent",
    summary="a gated linear recurrence h = a ⊙ h + (1 − a) ⊙ v, stepped token by token (example plugin)",
    options=(Option("expand", int, 1, "state width as a multiple of d_model", minimum=1, maximum=8),),
    api_version=2,
)
ALIBI_ATTENTION = ModelPlugin(
    factory="attnbench_example.layers:alibi_attention",
    kind="attention",
    summary="causal attention with ALiBi's linear distance bias instead of positions (example plugin)",
    api_version=2,
)
