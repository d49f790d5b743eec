"""LSTM and GRU (``torch.nn.LSTM``/``torch.nn.GRU``), torch-free: names, options, sizes, FLOPs, decode state.

FLOPs: per step and direction each gate is an (I+H)→H matmul, 2·gates·B·T·H·(I+H) in all, i.e. LSTM
8·B·T·H·(I+H), GRU 6·B·T·H·(I+H) (issue 3); element-wise gate math is not counted. The torch half is
``attnbench.families.rnn.layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from attnbench.core.cases import Case, OptionValue
from attnbench.families.base import ClaimRole, ExtraSpec, ModelSpec, OptionSpec, Preset, Problem
from attnbench.families.recurrent import RecurrentFamily

_BIDIRECTIONAL = OptionSpec(
    "bidirectional",
    bool,
    False,
    "run both directions; each gets half the hidden units, so the output width stays d_model",
)


class RnnFamily(RecurrentFamily):
    name = "rnn"
    order = 10
    # LSTM has 4 gates (i, f, g, o), GRU 3 (r, z, n).
    gates: ClassVar[dict[str, int]] = {"lstm": 4, "gru": 3}
    state_vectors: ClassVar[dict[str, int]] = {"lstm": 2, "gru": 1}
    extras = (
        ExtraSpec(
            "rnn_path",
            str,
            "",
            "which implementation torch.nn.LSTM/GRU ran on: cudnn, miopen, onednn, fused-cell-loop (CUDA, step by "
            "step) or aten-loop; found by profiling one call, not predicted",
            column=True,
        ),
    )

    def __init__(self) -> None:
        self.presets = (
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
        )
        self.models = tuple(
            ModelSpec(
                name,
                "recurrent",
                self.name,
                f"torch.nn.{name.upper()}, hidden = d_model (cuDNN on GPU, oneDNN/native on CPU)",
                options=self.network_options(name, (_BIDIRECTIONAL,)),
            )
            for name in ("lstm", "gru")
        )

    def causal(self, spec: ModelSpec, options: Mapping[str, OptionValue], requested: bool) -> bool:
        return not options.get("bidirectional", False)  # a unidirectional recurrence is causal by construction

    def decode_problem(self, case: Case) -> Problem | None:
        if case.causal:
            return None
        return Problem(
            f"a bidirectional {case.model} reads the sequence backwards too, so it cannot produce one token at a time "
            "(decode needs bidirectional: false)",
            "bidirectional",
            f"set bidirectional: false (or [false, true]: decode runs the unidirectional one), or leave {case.model} "
            "out of decode",
        )

    def peak_dtype(self, case: Case) -> str:
        """cuDNN runs float32 RNNs on TF32 tensor cores by default (torch.backends.cudnn.rnn.fp32_precision ==
        "tf32", i.e. allow_tf32 for RNNs), so the FP32 figure would put a healthy LSTM above 100 %."""
        return "tf32" if case.dtype == "float32" and case.device.startswith("cuda") else case.dtype

    def claim_role(self, case: Case) -> ClaimRole:
        return ClaimRole("rnn")  # the article's RNN/LSTM: one step after another

    def directions(self, case: Case) -> int:
        if not self.option(case, "bidirectional"):
            return 1
        if case.d_model % 2:
            raise ValueError(f"bidirectional {case.model} needs an even d_model, got {case.d_model}")
        return 2

    def cannot_build(self, case: Case) -> Problem | None:
        if self.option(case, "bidirectional") and case.d_model % 2:
            return Problem(
                f"bidirectional {case.model} gives each direction d_model/2 units, so d_model must be even; "
                f"{case.d_model} is odd",
                "bidirectional",
                "choose an even d_model, or bidirectional: false",
            )
        return super().cannot_build(case)

    def cell_parameters(self, model: str, inputs: int, hidden: int) -> int:
        return self.gates[model] * (inputs * hidden + hidden * hidden + 2 * hidden)  # W_ih, W_hh, b_ih, b_hh

    def gate_flops(self, model: str, tokens: int, inputs: int, hidden: int) -> int:
        return 2 * self.gates[model] * tokens * hidden * (inputs + hidden)


FAMILY = RnnFamily()
