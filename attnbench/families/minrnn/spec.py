"""minGRU and minLSTM (Feng et al. 2024, arXiv:2410.01201), torch-free: names, options, sizes, FLOPs, decode state.

Their gates depend on x_t alone, so the gate projections are one I→gates·H Linear over the whole sequence and the
recurrence left is a scan: minGRU has 2 gates (z, h̃), minLSTM 3 (f, i, h̃), and no H→H term (§3). The scan is
element-wise and not counted. The state is kept in float32 for 16-bit models, which keeps the recurrence from
losing its state to rounding. The torch half is ``attnbench.families.minrnn.layers``.
"""

from __future__ import annotations

from typing import ClassVar

from attnbench.core.cases import Case
from attnbench.families import shared
from attnbench.families.base import ClaimRole, ModelSpec, OptionSpec, Preset
from attnbench.families.recurrent import RecurrentFamily

_SCAN = OptionSpec(
    "scan",
    str,
    "parallel",
    "parallel: log-space scan over the whole sequence (Heinsen 2023, cumsum + logcumsumexp); "
    "sequential: the recurrence one step at a time",
    choices=("parallel", "sequential"),
)
_SUMMARIES = {
    "mingru": "minGRU (Feng et al. 2024, arXiv:2410.01201): gates from x_t alone, so the recurrence is a parallel scan",
    "minlstm": "minLSTM (Feng et al. 2024): normalised forget/input gates from x_t alone, parallel scan",
}


class MinRnnFamily(RecurrentFamily):
    name = "minrnn"
    order = 20
    gates: ClassVar[dict[str, int]] = {"mingru": 2, "minlstm": 3}
    state_vectors: ClassVar[dict[str, int]] = {"mingru": 1, "minlstm": 1}
    # A decode step is the recurrence's single step whichever scan fills the state (outside the timing).
    decode_inert = frozenset({"scan"})

    def __init__(self) -> None:
        self.presets = (
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
        self.models = tuple(
            ModelSpec(name, "recurrent", self.name, summary, options=self.network_options(name, (_SCAN,)))
            for name, summary in _SUMMARIES.items()
        )

    def claim_role(self, case: Case) -> ClaimRole:
        """The article's RNN, stepping one token after another, unless its scan runs the steps together (the
        parallel scan, which removes claim 1a's premise; a decode step is one step whatever the scan)."""
        scan = str(self.option(case, "scan"))
        shown = (("scan", scan),) if case.mode != "decode" else ()
        return ClaimRole("rnn", parallel=scan == "parallel" and case.mode != "decode", shown=shown)

    def cell_parameters(self, model: str, inputs: int, hidden: int) -> int:
        return self.gates[model] * (inputs * hidden + hidden)  # one Linear(I, gates·H); no H→H weights at all

    def gate_flops(self, model: str, tokens: int, inputs: int, hidden: int) -> int:
        return 2 * self.gates[model] * tokens * inputs * hidden

    def state_dtype(self, case: Case) -> str:
        return shared.kept(case, "float32" if shared.DTYPE_BYTES[case.dtype] < 4 else case.dtype)


FAMILY = MinRnnFamily()
