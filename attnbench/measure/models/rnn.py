"""Recurrent baselines: ``torch.nn.LSTM`` and ``torch.nn.GRU``.

They run on cuDNN on GPU and oneDNN/native kernels on CPU; we add nothing but a wrapper that keeps the output
width at d_model and drops the final hidden state, so every model maps (B, T, d_model) to the same shape. A
recurrent block (``attnbench.measure.models.blocks``) may ask for another hidden width and projects back itself.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)  # (B, T, directions · hidden); the final state is not needed
        return out
