"""Models you bring, asked the serving questions (issue 41): a module with the optional methods of the plugin protocol
(``Decodable``, ``Verifiable``, ``Packable``, a ``Resettable`` state) answers every one; a module without them is an
``unsupported`` row that names what it lacks. A real sweep of tiny torch modules, in-process."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.results.store import load_run
from tests.support import QUICK_TIMING

runner = CliRunner()

LAYERS = '''
import torch
from torch import nn


class State:
    def __init__(self, h):
        self.h, self.pending, self.saved = h, None, None

    def tensors(self):
        yield self.h

    def advance(self):
        self.h.copy_(self.pending)

    def reset(self):
        self.h.zero_()


class Decay(nn.Module):
    """h_t = 0.9 h_(t-1) + W x_t, y_t = h_t: every serving method of the plugin protocol."""

    def __init__(self, d, device, dtype):
        super().__init__()
        self.w = nn.Linear(d, d, bias=False, device=device, dtype=dtype)

    def _run(self, x, h):
        out = []
        for t in range(x.shape[1]):
            h = 0.9 * h + self.w(x[:, t])
            out.append(h)
        return torch.stack(out, dim=1), h

    def forward(self, x):
        return self._run(x, x.new_zeros(x.shape[0], x.shape[2]))[0]

    def init_state(self, batch, capacity):
        return State(self.w.weight.new_zeros(batch, self.w.in_features))

    def prefill(self, x, state, *, output=True):
        y, h = self._run(x, state.h)
        state.h.copy_(h)
        return y if output else None

    def step(self, x, state):
        y, state.pending = self._run(x, state.h)
        return y

    def verify(self, x, state):
        state.saved = (state.h.clone(), x)
        return self.prefill(x, state)

    def rollback(self, state, accepted):
        h, drafts = state.saved
        state.h.copy_(h)
        if accepted:
            self.prefill(drafts[:, :accepted], state, output=False)

    def packed(self, x, lengths):
        pieces, start = [], 0
        for length in lengths:
            pieces.append(self(x[:, start : start + length]))
            start += length
        return torch.cat(pieces, dim=1)


class Plain(nn.Module):
    def __init__(self, d, device, dtype):
        super().__init__()
        self.w = nn.Linear(d, d, device=device, dtype=dtype)

    def forward(self, x):
        return self.w(x)


def decay(request):
    return Decay(request.d_model, request.device, request.torch_dtype)


def plain(request):
    return Plain(request.d_model, request.device, request.torch_dtype)
'''


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "site"
    (root / "serving_layers").mkdir(parents=True)
    (root / "serving_layers" / "__init__.py").write_text("")
    (root / "serving_layers" / "layers.py").write_text(textwrap.dedent(LAYERS))
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.startswith("serving_layers")]:
        del sys.modules[name]


@pytest.mark.slow
def test_a_model_with_the_serving_protocol_answers_and_one_without_says_what_it_lacks(
    user_package: Path, tmp_path: Path
) -> None:
    config = tmp_path / "byo.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "byo-serving",
                "device": "cpu",
                "threads": 1,
                "models": [
                    {"name": "decay", "factory": "serving_layers.layers:decay", "kind": "recurrent"},
                    {"name": "plain", "factory": "serving_layers.layers:plain", "kind": "recurrent"},
                ],
                "modes": ["capacity", "prefill", "verify", "forward"],
                "causal": True,
                "grid": {"batch": [2], "seq_len": [8]},
                "d_model": 8,
                "heads": 2,
                "memory_budget": "16MiB",
                "prefill_chunk": 3,
                "draft": 3,
                "accept": 1,
                "packing": [4, 7],
                "telemetry": "off",
                "timing": dict(QUICK_TIMING),
            }
        )
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = {(r.case.model, r.case.mode): r for r in load_run(next(out.iterdir())).results}
    for mode in ("capacity", "prefill", "verify", "forward"):
        assert rows["decay", mode].status == "ok", rows["decay", mode].reason
    assert rows["decay", "verify"].extra["rollback_method"] == "verifiable"
    assert rows["decay", "capacity"].extra["capacity_batch"] > 1  # its state stood in by a real prefill
    lacks = {mode: rows["plain", mode] for mode in ("capacity", "prefill", "verify", "forward")}
    assert all(r.status == "unsupported" for r in lacks.values())
    assert "decode protocol" in lacks["prefill"].reason and "decode protocol" in lacks["capacity"].reason
    assert "decode protocol" in lacks["verify"].reason
    assert "Packable" in lacks["forward"].reason


LIARS = """

class PackedOne(Decay):
    def packed(self, x, lengths):
        return super().packed(x, lengths)[:, :1]  # (1, 1, d): the boundaries ignored, one token out


class PackedDouble(Decay):
    def packed(self, x, lengths):
        return super().packed(x, lengths).double()


class VerifyNone(Decay):
    def verify(self, x, state):
        super().verify(x, state)
        return None


class VerifyLast(Decay):
    def verify(self, x, state):
        return super().verify(x, state)[:, -1:]  # the last draft only


class RollbackBatch(Decay):
    def rollback(self, state, accepted):
        super().rollback(state, accepted)
        state.h = state.h[:1].clone()  # a state of one sequence where there were B

    def verify(self, x, state):
        state.saved = (state.h.clone(), x)
        y, h = self._run(x[: state.h.shape[0]], state.h)
        return y


class StepTwo(Decay):
    def step(self, x, state):
        y = super().step(x, state)
        return torch.cat([y, y], dim=1)  # (B, 2, d) in capacity


class PrefillLast(Decay):
    def prefill(self, x, state, *, output=True):
        y = super().prefill(x, state, output=output)
        return None if y is None else y[:, -1:]  # (B, 1, d) for a chunk


class PackedIgnore(Decay):
    def packed(self, x, lengths):
        return self(x)  # the boundaries ignored: one sequence's state runs into the next


class RollbackNothing(Decay):
    def rollback(self, state, accepted):
        pass  # the state stays after all k drafts


def liar(request):
    return globals()[request.options["cls"]](request.d_model, request.device, request.torch_dtype)
"""

LIES = {
    "PackedOne": "forward",
    "PackedDouble": "forward",
    "VerifyNone": "verify",
    "VerifyLast": "verify",
    "RollbackBatch": "verify",
    "StepTwo": "capacity",
    "PrefillLast": "prefill",
    "PackedIgnore": "forward",
    "RollbackNothing": "verify",
}


@pytest.mark.slow
def test_a_model_that_lies_through_a_serving_protocol_is_an_error_row(user_package: Path, tmp_path: Path) -> None:
    """Issue 50 §3.3: shapes, dtypes and devices are checked on every protocol call a serving question makes (packed,
    verify, rollback, a capacity step, a prefill chunk), not only on forward, and the equalities the questions
    promise (packed = each sequence alone; after a rollback = the accepted drafts decoded): each lie is an ``error``
    row with its reason, where it was timed and reported ``ok``; the honest model beside them answers every one."""
    layers = user_package / "serving_layers" / "layers.py"
    layers.write_text(layers.read_text() + textwrap.dedent(LIARS))
    models = [{"name": "decay", "factory": "serving_layers.layers:decay", "kind": "recurrent"}]
    models += [
        {"name": name.lower(), "factory": "serving_layers.layers:liar", "kind": "recurrent", "options": {"cls": name}}
        for name in LIES
    ]
    config = tmp_path / "liars.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "byo-liars",
                "device": "cpu",
                "threads": 1,
                "models": models,
                "modes": ["capacity", "prefill", "verify", "forward"],
                "causal": True,
                "grid": {"batch": [2], "seq_len": [8]},
                "d_model": 8,
                "heads": 2,
                "memory_budget": "16MiB",
                "prefill_chunk": 3,
                "draft": 3,
                "accept": 1,
                "packing": [4, 7],
                "telemetry": "off",
                "timing": dict(QUICK_TIMING),
            }
        )
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots"])
    assert result.exit_code == 1, result.output  # error rows fail the sweep
    rows = {(r.case.model, r.case.mode): r for r in load_run(next(out.iterdir())).results}
    for name, mode in LIES.items():
        lied = rows[name.lower(), mode]
        assert lied.status == "error" and "UserModelError" in lied.reason, (name, lied.status, lied.reason)
    for mode in ("capacity", "prefill", "verify", "forward"):  # a busy machine may find a step too slow
        assert rows["decay", mode].status in ("ok", "too_slow_for_budget"), rows["decay", mode].reason
