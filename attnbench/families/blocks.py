"""Full layers and whole models around the cores: the ``block`` and ``model`` scopes (issue 7).

A Transformer block here is BERT's encoder layer in the pre-norm arrangement of GPT-2 and most models since
(Xiong et al. 2020, arXiv:2002.04745): x + MHA(LN(x)), then x + FFN(LN(x)), FFN = Linear(d, m·d) → GELU →
Linear(m·d, d). BERT itself normalises after each residual (post-norm); both have the same weights and
operations per token, so the count and the time are the same. No dropout: it is random, which would break the
equalities the tests hold, and it costs one element-wise pass per sub-layer.

A recurrent block is the same skeleton with the LSTM/GRU/minGRU/minLSTM layer in the mixing slot:
x + Proj(RNN(LN(x))), Proj = Linear(width, d) only where the recurrent width differs from d (``match: params``).
It has no FFN on purpose: an LSTM layer mixes channels through its gates already, and an LSTM model of a given
size (ELMo's, the article's 110 M one) keeps its parameters in the recurrence. Adding an FFN would move two
thirds of them into a parallel matmul and so flatter the recurrent model on exactly the question asked.

A model is token embedding → positions → ``layers`` blocks → final LayerNorm, fed int64 token ids (B, T).

Each of them decodes (``attnbench.families.states``): a block's step is its forward on one token with the
mixing layer's step in the middle; a network embeds one token id and adds the positions at index n.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of, option_of
from attnbench.families.positional import input_encoding
from attnbench.families.shared import positions
from attnbench.families.states import (
    NetworkState,
    StackState,
    decodable,
    keep,
    opened,
    packed,
    rollback,
    spans,
    stack_init,
    stack_packed,
    stack_prefill,
    stack_rollback,
    stack_step,
    stack_verify,
    step_with,
    verify,
)
from attnbench.families.torch_family import TorchFamily, with_options

Front = tuple[nn.Embedding | None, nn.Module | None]
# The probe's vocabulary: building a BERT-base embedding just to ask whether its kernels run here would cost seconds.
_PROBE_VOCAB = 64


class FeedForward(nn.Module):
    """Linear(d, m·d) → GELU (exact, erf; as BERT) → Linear(m·d, d)."""

    def __init__(self, d_model: int, ffn_mult: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, ffn_mult * d_model, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn_mult * d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))  # (B, T, d) -> (B, T, m·d) -> (B, T, d)


class TransformerBlock(nn.Module):
    """Pre-norm encoder block around an attention layer (any core): (B, T, d) -> (B, T, d)."""

    def __init__(self, attention: nn.Module, d_model: int, ffn_mult: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        # LayerNorm draws no random numbers, so the attention weights made before this block are the same
        # whichever core the attention layer holds.
        self.norm1 = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.attention = attention
        self.norm2 = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.ffn = FeedForward(d_model, ffn_mult, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.ffn(self.norm2(x))

    def init_state(self, batch: int, capacity: int) -> Any:
        return decodable(self.attention).init_state(batch, capacity)

    def prefill(self, x: torch.Tensor, state: Any, *, output: bool = True) -> torch.Tensor | None:
        """The cache needs LN(x)'s keys and values only; the rest of the block only for the output."""
        attended = decodable(self.attention).prefill(self.norm1(x), state, output=output)
        if attended is None:
            return None
        x = x + attended
        return x + self.ffn(self.norm2(x))

    def step(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        x = x + decodable(self.attention).step(self.norm1(x), state)
        return x + self.ffn(self.norm2(x))

    def verify(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        x = x + verify(self.attention, self.norm1(x), state)
        return x + self.ffn(self.norm2(x))

    def rollback(self, state: Any, accepted: int) -> None:
        rollback(self.attention, state, accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """The norms and the FFN on the packed tokens; the attention sequence by sequence (its own ``packed``)."""
        x = x + packed(self.attention, self.norm1(x), lengths)
        return x + self.ffn(self.norm2(x))


class RecurrentBlock(nn.Module):
    """Pre-norm block around a recurrent layer of output width ``width``: (B, T, d) -> (B, T, d)."""

    def __init__(self, recurrent: nn.Module, width: int, d_model: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, device=device, dtype=dtype)
        self.recurrent = recurrent
        self.projection = nn.Linear(width, d_model, device=device, dtype=dtype) if width != d_model else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._project(self.recurrent(self.norm(x)))  # (B, T, width) -> (B, T, d)

    def _project(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.projection is None else self.projection(y)  # (B, T, width) -> (B, T, d)

    def init_state(self, batch: int, capacity: int) -> Any:
        return decodable(self.recurrent).init_state(batch, capacity)

    def prefill(self, x: torch.Tensor, state: Any, *, output: bool = True) -> torch.Tensor | None:
        y = decodable(self.recurrent).prefill(self.norm(x), state, output=output)
        return None if y is None else x + self._project(y)

    def step(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        return x + self._project(decodable(self.recurrent).step(self.norm(x), state))

    def verify(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        return x + self._project(verify(self.recurrent, self.norm(x), state))

    def rollback(self, state: Any, accepted: int) -> None:
        rollback(self.recurrent, state, accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """The norm and the projection on the packed tokens; the recurrence from zero at each sequence's start."""
        return x + self._project(packed(self.recurrent, self.norm(x), lengths))


class Stack(nn.Sequential):
    """Blocks applied in turn, as ``nn.Sequential`` (same parameter names), that also decode block by block."""

    def init_state(self, batch: int, capacity: int) -> StackState:
        return stack_init(self, batch, capacity)

    def prefill(self, x: torch.Tensor, state: StackState, *, output: bool = True) -> torch.Tensor | None:
        return stack_prefill(self, x, state, output=output)

    def step(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        return stack_step(self, x, state)

    def verify(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        return stack_verify(self, x, state)

    def rollback(self, state: StackState, accepted: int) -> None:
        stack_rollback(self, state, accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        return stack_packed(self, x, lengths)


class Network(nn.Module):
    """What every scope builds: [embedding] → [input positions] → body → [final norm].

    Scope core and block leave the embedding and final norm out and take (B, T, d) activations; scope model
    has both and takes (B, T) token ids. The output is (B, T, d_model) hidden states at every scope.
    """

    def __init__(
        self,
        body: nn.Module,
        *,
        embedding: nn.Embedding | None = None,
        positional: nn.Module | None = None,
        final_norm: nn.LayerNorm | None = None,
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.positional = positional
        self.body = body
        self.final_norm = final_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._finish(self.body(self._front(x, 0)))

    def _front(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """Token ids to vectors (scope model) and the positions from ``position`` on added."""
        if self.embedding is not None:
            x = self.embedding(x)  # (B, T) int64 -> (B, T, d)
        if self.positional is not None:
            x = self.positional(x, position)
        return x

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.final_norm is None else self.final_norm(x)

    def init_state(self, batch: int, capacity: int) -> NetworkState:
        return NetworkState(keep(partial(decodable(self.body).init_state, capacity=capacity), batch))

    def prefill(self, x: torch.Tensor, state: NetworkState, *, output: bool = True) -> torch.Tensor | None:
        """The context from the state's position on (a recurrent body may take a long context in chunks)."""
        with opened(state.body, commit=True) as body:
            y = decodable(self.body).prefill(self._front(x, state.position), body, output=output)
        state.position += x.shape[1]
        return None if y is None else self._finish(y)

    def step(self, x: torch.Tensor, state: NetworkState) -> torch.Tensor:
        """One token per sequence ((B, 1) ids or (B, 1, d)) at position n -> (B, 1, d_model)."""
        return self._finish(step_with(state.body, decodable(self.body).step, self._front(x, state.position)))

    def verify(self, x: torch.Tensor, state: NetworkState) -> torch.Tensor:
        """k draft tokens at positions n…n+k−1 -> (B, k, d_model); the body keeps what the rollback needs."""
        with opened(state.body, commit=True) as body:
            y = verify(self.body, self._front(x, state.position), body)
        state.verified_from = state.position
        state.position += x.shape[1]
        return self._finish(y)

    def rollback(self, state: NetworkState, accepted: int) -> None:
        with opened(state.body, commit=True) as body:
            rollback(self.body, body, accepted)
        state.position = state.verified_from + accepted

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """Packed sequences ((1, T) ids or (1, T, d)): each one's positions from 0, the body sequence by sequence."""
        if self.embedding is not None:
            x = self.embedding(x)  # (1, T) int64 -> (1, T, d)
        if self.positional is not None:
            x = torch.cat([self.positional(x[:, start:end], 0) for start, end in spans(lengths)], dim=1)
        return self._finish(packed(self.body, x, lengths))


def front(case: Case, device: str, dtype: torch.dtype) -> Front:
    """The token embedding (scope model) and the input positions, made before any layer: the order in which
    modules are made fixes which random numbers each weight gets, so it must not depend on the core."""
    embedding = None
    if option_of(case, "scope") == "model":
        embedding = nn.Embedding(int(option_of(case, "vocab")), case.d_model, device=device, dtype=dtype)
    kind = str(option_of(case, "positional"))
    return embedding, input_encoding(
        kind, case.d_model, positions(case, family_of(case).values(case)), device=device, dtype=dtype
    )


def network(case: Case, body: nn.Module, made: Front, device: str, dtype: torch.dtype) -> nn.Module:
    """``body`` at the case's scope: alone (with input positions, if any), or as a whole model with the embedding in
    front and a final LayerNorm after."""
    embedding, positional = made
    if option_of(case, "scope") != "model":
        return body if positional is None else Network(body, positional=positional)
    final_norm = nn.LayerNorm(case.d_model, device=device, dtype=dtype)
    return Network(body, embedding=embedding, positional=positional, final_norm=final_norm)


def recurrent_network(
    case: Case,
    core: Callable[[], nn.Module],
    layer: Callable[[int], nn.Module],
    width: int,
    device: str,
    dtype: torch.dtype,
) -> nn.Module:
    """A recurrent family's model: at scope core the family's own stack (``core()``); otherwise ``case.layers``
    recurrent blocks around ``layer(i)``, each ``width`` wide (directions × hidden) with a projection back to
    d_model where that differs."""
    made = front(case, device, dtype)
    if option_of(case, "scope") == "core":
        return network(case, core(), made, device, dtype)
    blocks = [RecurrentBlock(layer(i), width, case.d_model, device=device, dtype=dtype) for i in range(case.layers)]
    return network(case, Stack(*blocks), made, device, dtype)


class NetworkFamily(TorchFamily):
    """The torch half of a family with the network options (scope, positions, vocabulary): its probe shrinks the
    vocabulary and the learned table with the case."""

    def tiny(self, case: Case) -> Case:
        tiny = super().tiny(case)
        options = dict(case.options)
        if "vocab" in options or option_of(case, "scope") == "model":
            options["vocab"] = min(_PROBE_VOCAB, int(option_of(case, "vocab")))
        if int(option_of(case, "max_len")):
            options["max_len"] = tiny.seq_len + (case.span - case.seq_len)  # a decode also needs position n
        return replace(tiny, options=tuple(sorted(options.items())))

    def check_case(self, case: Case) -> Case:
        """The probe's model at the check's length: its learned table covers the check's positions."""
        small = super().check_case(case)
        if not int(option_of(case, "max_len")):
            return small
        options = {**dict(small.options), "max_len": small.seq_len + (case.span - case.seq_len)}
        return replace(small, options=tuple(sorted(options.items())))


class ChunkedFormFamily(NetworkFamily):
    """A family whose fast form is chunked (options ``form``, ``chunk``, ``kernel``) beside its per-token
    recurrence: the numerical check runs two whole chunks and part of a third, so the state a chunked form carries
    across chunks is on the path, and holds the case to the recurrent form in plain torch, what the chunked form
    and the fused kernels compute faster."""

    def check_seq_len(self, case: Case) -> int:
        family = family_of(case)
        if family.option(case, "form") != "chunked":
            return super().check_seq_len(case)
        return 2 * int(family.option(case, "chunk")) + 3

    def reference_case(self, case: Case) -> Case:
        return with_options(super().reference_case(case), {"form": "recurrent", "kernel": "torch"})
