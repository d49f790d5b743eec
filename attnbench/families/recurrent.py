"""What the gated recurrent families share (``rnn``: LSTM, GRU; ``minrnn``: minGRU, minLSTM), torch-free: the layer
widths (``match: params`` sizes a block like the attention block it stands in for), the gate matmuls, the
parameters and the decode state. Not a family itself: it has no ``FAMILY``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import Family, OptionSpec, Parts, Problem, ValueOf

__all__ = ["RecurrentFamily"]


class RecurrentFamily(Family):
    """A family of recurrent layers whose work is ``gates`` matmuls per step (``work``), sized d_model or matched."""

    # Matmuls per step and direction, by model (each an (I+H)→H product for LSTM/GRU, I→H for the min-RNNs).
    gates: ClassVar[dict[str, int]] = {}
    # Tensors of (layers, B, hidden) a decode state holds, by model: h and c for an LSTM, h otherwise.
    state_vectors: ClassVar[dict[str, int]] = {}

    def network_options(self, model: str, first: tuple[OptionSpec, ...]) -> tuple[OptionSpec, ...]:
        presets = tuple(p.name for p in self.presets if p.model == model)
        return (
            *first,
            shared.SCOPE,
            shared.MATCH,
            shared.FFN_MULT,
            shared.VOCAB,
            shared.positional(rope=False),
            shared.MAX_LEN,
            shared.preset(*presets),
            shared.COMPILE,
        )

    # ------------------------------------------------------------------------------------------------ sizes
    def cell_parameters(self, model: str, inputs: int, hidden: int) -> int:
        """Parameters of one recurrent layer, one direction."""
        raise NotImplementedError

    def directions(self, case: Case) -> int:
        return 1

    def block_parameters(self, model: str, d_model: int, hidden: int, directions: int = 1) -> int:
        """LayerNorm, the recurrent layer (``directions`` × ``hidden`` wide), a Linear back to d_model if needed."""
        width = directions * hidden
        projection = width * d_model + d_model if width != d_model else 0
        return 2 * d_model + directions * self.cell_parameters(model, d_model, hidden) + projection

    @lru_cache(maxsize=256)  # noqa: B019 (the families live as long as the process)
    def matched_hidden(self, model: str, d_model: int, directions: int, ffn_mult: int) -> int:
        """The hidden width (per direction) whose recurrent block is closest in size to the attention block of
        the same d_model and ffn_mult, preferring a multiple of 8 within ``MATCH_TOLERANCE`` of it."""
        target = shared.attention_block_parameters(d_model, ffn_mult)

        def projected(hidden: int) -> int:
            width = directions * hidden
            return 2 * d_model + directions * self.cell_parameters(model, d_model, hidden) + width * d_model + d_model

        natural = d_model // directions if d_model % directions == 0 else None
        return shared.matched_width(
            lambda hidden: self.block_parameters(model, d_model, hidden, directions), projected, target, natural
        )

    def match_error(self, model: str, d_model: int, directions: int, ffn_mult: int) -> float:
        """How far (relative) the matched recurrent block is from the attention block's parameter count."""
        target = shared.attention_block_parameters(d_model, ffn_mult)
        got = self.block_parameters(
            model, d_model, self.matched_hidden(model, d_model, directions, ffn_mult), directions
        )
        return abs(got - target) / target

    def hidden(self, case: Case) -> int:
        """The hidden width per direction of ``case``'s recurrent layers: d_model (split over the directions) at
        scope core and with ``match: hidden``; with ``match: params`` the matched width. ValueError where no width
        gets within ``MATCH_TOLERANCE`` (tiny d_model: the sizes move in coarse steps)."""
        directions = self.directions(case)
        if self.option(case, "scope") == "core" or self.option(case, "match") == "hidden":
            return case.d_model // directions
        problem = self._match_problem(case)
        if problem is not None:
            raise ValueError(problem.message)
        return self.matched_hidden(case.model, case.d_model, directions, int(self.option(case, "ffn_mult")))

    def _match_problem(self, case: Case) -> Problem | None:
        if self.option(case, "scope") == "core" or self.option(case, "match") != "params":
            return None
        error = self.match_error(case.model, case.d_model, self.directions(case), int(self.option(case, "ffn_mult")))
        if error <= shared.MATCH_TOLERANCE:
            return None
        return Problem(
            f"match: params finds no hidden width for {case.model} at d_model {case.d_model} within "
            f"{shared.MATCH_TOLERANCE:.0%} of the attention block's parameters (best is {error:.1%} off)",
            "match",
            "use a larger d_model (the sizes move in coarse steps when it is small), or match: hidden",
        )

    # ------------------------------------------------------------------------------------------------ rules
    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return shared.network_no_effect(name, value_of, recurrent=True)

    def cannot_build(self, case: Case) -> Problem | None:
        return shared.network_cannot_build(case, self.values(case)) or self._match_problem(case)

    # ------------------------------------------------------------------------------------------------ work
    def formula(self, case: Case) -> str:
        return shared.versioned(
            shared.scope_stem(self.values(case), case.model), shared.DECODE_SUFFIX * (case.mode == "decode")
        )

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        """Forward and backward of a recurrent stack (core) or of recurrent blocks. A decode step is the same count
        for one token per sequence (``case.tokens``): the cell's work per step does not depend on how many came
        before."""
        d, tokens = case.d_model, case.tokens
        directions, hidden = self.directions(case), self.hidden(case)
        gates = projection = 0
        for layer in range(case.layers):
            # At scope core the stack's later layers take the previous layer's output; a block's layer takes d.
            inputs = d if layer == 0 or self.option(case, "scope") != "core" else hidden * directions
            gates += directions * self.gate_flops(case.model, tokens, inputs, hidden)
            if self.option(case, "scope") != "core" and directions * hidden != d:
                projection += 2 * tokens * directions * hidden * d  # the block's Linear back to d_model
        forward = {"gates": gates} | ({"projection": projection} if projection else {})
        # Backward ≈ 2× forward (both dX/dh and dW per matmul). Exactly, autograd skips dh₀ at the first step
        # (h₀ = 0 needs no gradient): one step's hidden matmuls per layer and direction, a 1/T-sized difference.
        return forward, {name: shared.MATMUL_BACKWARD * flops for name, flops in forward.items()}

    def gate_flops(self, model: str, tokens: int, inputs: int, hidden: int) -> int:
        """The gate matmuls of one layer and direction over ``tokens`` steps."""
        raise NotImplementedError

    def parameters(self, case: Case) -> int:
        d, directions, hidden = case.d_model, self.directions(case), self.hidden(case)
        if self.option(case, "scope") != "core":
            body = case.layers * self.block_parameters(case.model, d, hidden, directions)
        else:
            body = sum(
                directions * self.cell_parameters(case.model, d if layer == 0 else directions * hidden, hidden)
                for layer in range(case.layers)
            )
        return shared.network_parameters(case, self.values(case), body)

    def state_bytes(self, case: Case) -> int:
        """h (and c) of every layer and sequence: constant in n."""
        element = shared.DTYPE_BYTES[self.state_dtype(case)]
        return self.state_vectors[case.model] * case.layers * case.batch * self.hidden(case) * element

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"

    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        return shared.embedding_table(case, self.values(case))

    def intermediate_elements(self, case: Case) -> int:
        """Per layer and direction the input side of the gates for every token (``gates`` × hidden): LSTM and GRU
        (cuDNN, oneDNN, ATen alike) multiply the whole sequence's inputs by W_ih before the recurrence reads them,
        and the min-RNNs' one Linear writes what their scan reads. A block adds its LayerNorm's output and the
        layer's (read by the projection back to d_model, or by the residual)."""
        directions, hidden = self.directions(case), self.hidden(case)
        layer = directions * self.gates[case.model] * hidden
        if self.option(case, "scope") != "core":
            layer += case.d_model + directions * hidden
        return case.layers * case.tokens * layer + shared.network_interfaces(case, self.values(case))
