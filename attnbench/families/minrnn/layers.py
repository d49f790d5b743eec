"""minGRU and minLSTM (Feng et al. 2024, "Were RNNs All We Needed?", arXiv:2410.01201), in plain PyTorch.

Both drop the hidden state from their gates: z_t, f_t, i_t and the candidate h̃_t depend on x_t alone. The
recurrence left, h_t = a_t ⊙ h_{t−1} + b_t, is linear in h, so all T steps can be computed at once by a scan
instead of T dependent steps. The paper's log-space form keeps every a_t, b_t positive, and Heinsen (2023,
"Efficient Parallelization of a Ubiquitous Sequential Computation", arXiv:2311.06281) evaluates the scan as

    log h_t = a*_t + log Σ_{k≤t} exp(log b_k − a*_k),    a*_t = Σ_{j≤t} log a_j,

one ``cumsum`` and one ``logcumsumexp``. h_0 = 0 (as torch.nn.LSTM/GRU default), so its term drops out. The
``sequential`` scan runs the same recurrence one step at a time, the RNN way; a test holds the two equal.

The scan runs in at least float32: in bfloat16, a*_t reaches −(hundreds) within a few hundred steps and its
8-bit mantissa would leave nothing of log h_t. The Linear layers run in the model's dtype.

Decoding: the prefill runs the layer's own scan over the context and keeps h_n (in the scan's dtype); a step is
the recurrence's single step, h = a_t ⊙ h_{n} + b_t, whichever scan the layer uses for a whole sequence.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.blocks import NetworkFamily, recurrent_network
from attnbench.families.minrnn.spec import FAMILY
from attnbench.families.states import LayerStack, RecurrentState
from attnbench.families.torch_family import with_options

Scan = Literal["parallel", "sequential"]
MinCell = Literal["mingru", "minlstm"]


def g(x: torch.Tensor) -> torch.Tensor:
    """The paper's positive activation for h̃: x + 0.5 for x ≥ 0, σ(x) below (continuous at 0)."""
    return torch.where(x >= 0, x + 0.5, x.sigmoid())


def log_g(x: torch.Tensor) -> torch.Tensor:
    """log g(x), computed without forming g: log(x + 0.5) for x ≥ 0, log σ(x) below.

    ``logsigmoid`` rather than the paper's −softplus(−x): the same function, but ``F.softplus`` returns its
    input unchanged past 20, an e⁻²⁰ error that float64 sees.
    """
    return torch.where(x >= 0, (x.relu() + 0.5).log(), F.logsigmoid(x))


def parallel_scan_log(log_a: torch.Tensor, log_b: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """log h for h_t = a_t h_{t−1} + b_t, from log a and log b of shape (B, T, H), along dim 1; h_0 = 0, or the
    (B, H) ``h0`` (≥ 0, as every minGRU/minLSTM state is), whose term log h_0 − a*_0 = log h_0 leads the sum."""
    a_star = log_a.cumsum(dim=1)  # (B, T, H): log Π_{j≤t} a_j
    terms = log_b - a_star
    if h0 is None:
        return a_star + terms.logcumsumexp(dim=1)
    with_h0 = torch.cat((h0.log().unsqueeze(1), terms), dim=1).logcumsumexp(dim=1)  # log 0 = −inf adds nothing
    return a_star + with_h0[:, 1:]


def sequential_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """h for h_t = a_t h_{t−1} + b_t from h_0 = 0 (or ``h0``), one dependent step per token: (B, T, H) ->
    (B, T, H)."""
    h = torch.zeros_like(b[:, 0]) if h0 is None else h0  # (B, H)
    out = []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def _scan_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class MinRNN(nn.Module):
    """One minGRU or minLSTM layer, (B, T, inputs) -> (B, T, hidden).

    minGRU:  z_t = σ(W_z x_t),  h̃_t = g(W_h x_t),  h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t.
    minLSTM: f_t = σ(W_f x_t),  i_t = σ(W_i x_t),  h̃_t = g(W_h x_t),  f'_t, i'_t = f_t, i_t / (f_t + i_t),
             h_t = f'_t ⊙ h_{t−1} + i'_t ⊙ h̃_t.
    The gate projections are one fused Linear(inputs, gates · hidden) applied to the whole sequence at once.
    """

    # A verify runs the drafts as decode steps, keeping h after each (attnbench.families.serving).
    rollback_method = "checkpoint"

    def __init__(self, cell: MinCell, inputs: int, hidden: int, *, scan: Scan, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        if cell not in ("mingru", "minlstm"):
            raise ValueError(f"unknown cell {cell!r}; one of: mingru, minlstm")
        if scan not in ("parallel", "sequential"):
            raise ValueError(f"unknown scan {scan!r}; one of: parallel, sequential")
        self.cell, self.scan, self.hidden = cell, scan, hidden
        gates = 2 if cell == "mingru" else 3
        self.gates = nn.Linear(inputs, gates * hidden, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._scan(x).to(x.dtype)  # (B, T, H)

    def _scan(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
        """h_1…h_T from h_0 = 0 (or ``h0``, (B, H)), in the scan's dtype: (B, T, inputs) -> (B, T, H)."""
        pre = self.gates(x).to(_scan_dtype(x.dtype))  # (B, T, gates · H)
        if self.scan == "parallel":
            log_a, log_b = self._log_coefficients(pre)
            return parallel_scan_log(log_a, log_b, h0).exp()
        return sequential_scan(*self._coefficients(pre), h0)

    def init_state(self, batch: int, capacity: int) -> RecurrentState:
        """h, (1, B, hidden) in the scan's dtype, zero (h_0); the same size after any number of tokens."""
        weight = self.gates.weight
        return RecurrentState(torch.zeros(1, batch, self.hidden, device=weight.device, dtype=_scan_dtype(weight.dtype)))

    def prefill(self, x: torch.Tensor, state: RecurrentState, *, output: bool = True) -> torch.Tensor | None:
        """The layer's own scan over the context, from the state it carries (so a long context can come in
        chunks); keeps h_n."""
        h = self._scan(x, state.h[0])  # (B, n, H)
        if h.shape[1]:  # an empty context leaves h_0
            state.h[0].copy_(h[:, -1])
        return h.to(x.dtype) if output else None

    def step(self, x: torch.Tensor, state: RecurrentState) -> torch.Tensor:
        """(B, 1, inputs) -> (B, 1, H): h = a ⊙ h_n + b, with h_n left as it was."""
        a, b = self._coefficients(self.gates(x[:, 0]).to(state.h.dtype))  # 2 × (B, H)
        h = a * state.h[0] + b
        state.pending = ([h], None)
        return h.to(x.dtype).unsqueeze(1)

    def _log_coefficients(self, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log a_t, log b_t straight from the pre-activations, never forming a gate that could round to 0."""
        if self.cell == "mingru":
            k, h_pre = pre.chunk(2, dim=-1)
            return F.logsigmoid(-k), F.logsigmoid(k) + log_g(h_pre)  # log(1 − σ(k)), log σ(k) + log h̃
        f_pre, i_pre, h_pre = pre.chunk(3, dim=-1)
        # log f' = log f − log(f + i) = −softplus(log i − log f) = log σ(log f − log i) (paper, App. B).
        diff = F.logsigmoid(f_pre) - F.logsigmoid(i_pre)  # log f − log i
        return F.logsigmoid(diff), F.logsigmoid(-diff) + log_g(h_pre)

    def _coefficients(self, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a_t, b_t as the paper's sequential mode writes them."""
        if self.cell == "mingru":
            k, h_pre = pre.chunk(2, dim=-1)
            z = k.sigmoid()
            return 1 - z, z * g(h_pre)
        f_pre, i_pre, h_pre = pre.chunk(3, dim=-1)
        f, i = f_pre.sigmoid(), i_pre.sigmoid()
        total = f + i
        return f / total, i / total * g(h_pre)

    def extra_repr(self) -> str:
        return f"cell={self.cell}, hidden={self.hidden}, scan={self.scan}"


class MinRNNStack(LayerStack):
    """``layers`` minGRU/minLSTM layers of width d_model applied in turn, as nn.GRU(num_layers=…) stacks."""

    def __init__(
        self, cell: MinCell, d_model: int, layers: int, *, scan: Scan, device: str, dtype: torch.dtype
    ) -> None:
        super().__init__([MinRNN(cell, d_model, d_model, scan=scan, device=device, dtype=dtype) for _ in range(layers)])


class MinRnnTorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        cell: MinCell = "mingru" if case.model == "mingru" else "minlstm"
        scan: Scan = "parallel" if FAMILY.option(case, "scan") == "parallel" else "sequential"
        hidden = FAMILY.hidden(case)  # d_model, or matched to the attention block's parameters
        return recurrent_network(
            case,
            lambda: MinRNNStack(cell, case.d_model, case.layers, scan=scan, device=device, dtype=dtype),
            lambda _: MinRNN(cell, case.d_model, hidden, scan=scan, device=device, dtype=dtype),
            hidden,
            device,
            dtype,
        )

    def reference_case(self, case: Case) -> Case:
        """The recurrence one step at a time: what the parallel (log-space) scan computes faster."""
        return with_options(super().reference_case(case), {"scan": "sequential"})


TORCH = MinRnnTorch()
