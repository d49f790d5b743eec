"""Recurrent baselines: ``torch.nn.LSTM`` and ``torch.nn.GRU``.

They run on cuDNN on GPU and oneDNN/native kernels on CPU; we add nothing but a wrapper that keeps the output
width at d_model and drops the final hidden state, so every model maps (B, T, d_model) to the same shape. A
recurrent block (``attnbench.measure.models.blocks``) may ask for another hidden width and projects back itself.

Decoding carries the final state on: a prefill runs the module over the context from the zero state (the
whole-sequence form) and keeps (h, c); a step is one cell step per layer (``torch.lstm_cell``/``torch.gru_cell``
on the same weights), as a generator would run it. A step through ``nn.LSTM`` with a length-1 sequence would be
the same arithmetic, but on a CPU oneDNN builds its RNN primitive afresh for every call (~0.5–1.4 ms measured
here at d_model 256, against ~0.1 ms for the cell), which would time the library's set-up, not the recurrence.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from attnbench.measure.models.decoding import RecurrentState

Cell = Literal["lstm", "gru"]


class Recurrent(nn.Module):
    """A stack of ``layers`` LSTM or GRU layers, batch-first, output width d_model by default.

    Bidirectional: each direction gets d_model/2 hidden units, so the concatenated output is still d_model
    wide and the next layer (and the caller) sees the same width as the unidirectional model. ``hidden`` (per
    direction) overrides that; the output is then directions × hidden wide.
    """

    def __init__(
        self,
        cell: Cell,
        d_model: int,
        layers: int,
        *,
        bidirectional: bool,
        device: str,
        dtype: torch.dtype,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        if hidden is None:
            if bidirectional and d_model % 2:
                raise ValueError(
                    f"bidirectional {cell} needs an even d_model (each direction gets d_model/2), got {d_model}"
                )
            hidden = d_model // 2 if bidirectional else d_model
        rnn_type = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_type(
            d_model,
            hidden,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            device=device,
            dtype=dtype,
        )
        self.cell = cell

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)  # (B, T, directions · hidden); the final state is not needed
        return out

    def init_state(self, batch: int, capacity: int) -> RecurrentState:
        """h (and c) of every layer, (layers, B, hidden), zero: the state before the first token. ``capacity``
        does not matter: the state has the same size after any number of tokens."""
        if self.rnn.bidirectional:
            raise NotImplementedError(
                f"a bidirectional {self.cell} reads the sequence backwards too, so it cannot decode one token at a time"
            )
        weight = next(self.rnn.parameters())
        shape = (self.rnn.num_layers, batch, self.rnn.hidden_size)
        h = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        return RecurrentState(h, torch.zeros_like(h) if self.cell == "lstm" else None)

    def prefill(self, x: torch.Tensor, state: RecurrentState, *, output: bool = True) -> torch.Tensor | None:
        """The whole-sequence module from the carried state (zero at first); the state after the last token."""
        if x.shape[1] == 0:  # an empty context (nn.LSTM refuses one) leaves the state as it was
            return x.new_zeros(x.shape[0], 0, self.rnn.hidden_size) if output else None
        if state.c is not None:
            out, (h, c) = self.rnn(x, (state.h, state.c))
            state.c.copy_(c)
        else:
            out, h = self.rnn(x, state.h)
        state.h.copy_(h)
        return out if output else None

    def step(self, x: torch.Tensor, state: RecurrentState) -> torch.Tensor:
        """(B, 1, inputs) -> (B, 1, hidden): one cell step per layer from (h, c), which stay as they were."""
        y = x[:, 0]  # (B, inputs)
        hs, cs = [], []
        for layer in range(self.rnn.num_layers):
            weights = (
                getattr(self.rnn, f"weight_ih_l{layer}"),
                getattr(self.rnn, f"weight_hh_l{layer}"),
                getattr(self.rnn, f"bias_ih_l{layer}"),
                getattr(self.rnn, f"bias_hh_l{layer}"),
            )
            if state.c is not None:
                y, c = torch.lstm_cell(y, (state.h[layer], state.c[layer]), *weights)
                cs.append(c)
            else:
                y = torch.gru_cell(y, state.h[layer], *weights)
            hs.append(y)
        state.pending = (hs, cs or None)  # per layer; a stack would be one more copy inside the timed step
        return y.unsqueeze(1)  # (B, 1, hidden)
