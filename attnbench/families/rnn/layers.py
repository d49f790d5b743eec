"""Recurrent baselines: ``torch.nn.LSTM`` and ``torch.nn.GRU``.

They run on cuDNN on GPU and oneDNN/native kernels on CPU; we add nothing but a wrapper that keeps the output
width at d_model and drops the final hidden state, so every model maps (B, T, d_model) to the same shape. A
recurrent block (``attnbench.families.blocks``) may ask for another hidden width and projects back itself.

Decoding carries the final state on: a prefill runs the module over the context from the zero state (the
whole-sequence form) and keeps (h, c); a step is one cell step per layer (``torch.lstm_cell``/``torch.gru_cell``
on the same weights), as a generator would run it. A step through ``nn.LSTM`` with a length-1 sequence would be
the same arithmetic, but on a CPU oneDNN builds its RNN primitive afresh for every call (~0.5–1.4 ms measured
here at d_model 256, against ~0.1 ms for the cell), which would time the library's set-up, not the recurrence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import NetworkFamily, recurrent_network
from attnbench.families.rnn.spec import FAMILY
from attnbench.families.states import RecurrentState, keep, opened, spans, step_with
from attnbench.families.torch_family import make_input, rng_untouched, torch_dtype

Cell = Literal["lstm", "gru"]


class Recurrent(nn.Module):
    """A stack of ``layers`` LSTM or GRU layers, batch-first, output width d_model by default.

    Bidirectional: each direction gets d_model/2 hidden units, so the concatenated output is still d_model
    wide and the next layer (and the caller) sees the same width as the unidirectional model. ``hidden`` (per
    direction) overrides that; the output is then directions × hidden wide.

    A verify copies (h, c) and runs the drafts through the fused whole-sequence kernel, which keeps no state per
    token; its rollback copies them back and runs the accepted drafts again (``rollback_method`` replay). Packed
    lengths go in as torch's ``PackedSequence``: cuDNN's and oneDNN's varlen path, each sequence from the zero state.
    """

    rollback_method = "replay"

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

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """(1, T, inputs) of packed sequences -> (1, T, directions · hidden), through a ``PackedSequence``."""
        pieces = [x[0, start:end] for start, end in spans(lengths)]
        out, _ = self.rnn(nn.utils.rnn.pack_sequence(pieces, enforce_sorted=False))
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)  # (N, longest, width), in the given order
        return torch.cat([padded[i, :length] for i, length in enumerate(lengths)])[None]

    def init_state(self, batch: int, capacity: int) -> RecurrentState:
        """h (and c) of every layer, (layers, B, hidden), zero: the state before the first token. ``capacity``
        does not matter: the state has the same size after any number of tokens."""
        if self.rnn.bidirectional:
            raise NotImplementedError(
                f"a bidirectional {self.cell} reads the sequence backwards too, so it cannot decode one token at a time"
            )
        return keep(self._zero_state, batch)  # kept here too: this module may be the whole model, with no stack

    def _zero_state(self, batch: int) -> RecurrentState:
        weight = next(self.rnn.parameters())
        h = torch.zeros((self.rnn.num_layers, batch, self.rnn.hidden_size), device=weight.device, dtype=weight.dtype)
        return RecurrentState(h, torch.zeros_like(h) if self.cell == "lstm" else None)

    def prefill(self, x: torch.Tensor, state: RecurrentState, *, output: bool = True) -> torch.Tensor | None:
        """The whole-sequence module from the carried state (zero at first); the state after the last token."""
        with opened(state, commit=True) as held:
            return self._prefill(x, held, output=output)

    def step(self, x: torch.Tensor, state: RecurrentState) -> torch.Tensor:
        return step_with(state, self._step, x)

    def _prefill(self, x: torch.Tensor, state: RecurrentState, *, output: bool) -> torch.Tensor | None:
        if x.shape[1] == 0:  # an empty context (nn.LSTM refuses one) leaves the state as it was
            return x.new_zeros(x.shape[0], 0, self.rnn.hidden_size) if output else None
        if state.c is not None:
            out, (h, c) = self.rnn(x, (state.h, state.c))
            state.c.copy_(c)
        else:
            out, h = self.rnn(x, state.h)
        state.h.copy_(h)
        return out if output else None

    def _step(self, x: torch.Tensor, state: RecurrentState) -> torch.Tensor:
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


# The operator that gives each implementation of torch.nn.LSTM/GRU away, in the order they are looked for. bf16
# LSTM/GRU run on cuDNN only where torch was built against cuDNN 9.13+ (and on sm80+); elsewhere CUDA runs fused
# cells step by step. On a CPU, oneDNN takes LSTM (float32, bf16) and everything else is a loop of aten ops.
RNN_PATHS: tuple[tuple[str, str], ...] = (
    ("aten::_cudnn_rnn", "cudnn"),
    ("aten::miopen_rnn", "miopen"),
    ("aten::mkldnn_rnn_layer", "onednn"),
    ("aten::_thnn_fused_lstm_cell", "fused-cell-loop"),
    ("aten::_thnn_fused_gru_cell", "fused-cell-loop"),
)
RNN_LOOP = "aten-loop"  # none of the above: one aten matmul and element-wise ops per step, from Python-free C++


class RnnTorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        cell: Cell = "lstm" if case.model == "lstm" else "gru"
        bidirectional = bool(FAMILY.option(case, "bidirectional"))
        hidden = FAMILY.hidden(case)  # d_model per direction, or matched to the attention block's parameters
        directions = FAMILY.directions(case)
        return recurrent_network(
            case,
            lambda: Recurrent(cell, case.d_model, case.layers, bidirectional=bidirectional, device=device, dtype=dtype),
            lambda _: Recurrent(
                cell, case.d_model, 1, bidirectional=bidirectional, device=device, dtype=dtype, hidden=hidden
            ),
            directions * hidden,
            device,
            dtype,
        )

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        return {"rnn_path": rnn_path(case, device)}


def rnn_path(case: Case, device: str) -> str | None:
    """Which implementation ``case``'s LSTM/GRU runs on (``RNN_PATHS``, else ``RNN_LOOP``); None for a model of
    another family.

    Found, not predicted: one forward of the probe-sized model under the profiler (operator names only, as the
    host dispatched them, whatever the device), outside any timed region. The choice depends on device, dtype,
    cuDNN's build and flags, not on sizes. autograd's own profiler, not kineto's: this needs only the names, and
    the first kineto profile of a process imports torch._dynamo (1.4-1.9 s, against 20 ms for this)."""
    from torch.autograd.profiler import profile

    if case.definition is not None or case.model not in FAMILY.gates:
        return None
    tiny = TORCH.tiny(case)
    dtype = torch_dtype(case.dtype)
    with rng_untouched(device):
        model, x = TORCH.build(tiny, device, dtype), make_input(tiny, device, dtype)
        grad = torch.inference_mode() if case.mode == "forward" else contextlib.nullcontext()
        with grad, profile(use_kineto=False) as prof:
            model(x)
    names = {event.name for event in prof.function_events}
    return next((path for op, path in RNN_PATHS if op in names), RNN_LOOP)


TORCH = RnnTorch()
