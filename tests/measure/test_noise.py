"""The machine's between-process noise (issue 17, item 3): measured by calibrate, stored with the calibration,
and used by compare as its floor when one process per side is all there is."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from attnbench.analysis.compare import (
    DEFAULT_NOISE_FLOOR,
    UNMEASURED_SOURCE,
    Policy,
    Side,
    compare_sides,
    load_side,
)
from attnbench.cli.device import noise_line
from attnbench.core.stats import student_t_975
from attnbench.instrument import noise as noise_module
from attnbench.instrument.noise import measure_noise, noise_floor
from attnbench.results.calibration import Calibration, NoiseFloor
from attnbench.results.environment import Environment
from attnbench.results.fields import FieldError
from attnbench.results.records import Run
from tests.support import DATA, mentions, numbers, quick_policy, tiny_case

BASE, CURRENT = DATA / "compare" / "base", DATA / "compare" / "current"


def _noise(floor: float, contended: int = 0) -> NoiseFloor:
    return NoiseFloor(floor, math.log1p(floor) / 3, 5, ("a", "b"), (0.1, 0.2), "2026-12-03T00:00:00Z", contended)


def _calibration(noise: NoiseFloor | None) -> Calibration:
    return Calibration("0" * 16, "cpu", "cpu", "2026-12-03T00:00:00Z", None, 2, (), noise=noise)


def test_the_floor_is_a_95_percent_interval_of_the_ratio_of_two_processes() -> None:
    # Two cases, three processes each, log medians ±d around their centre: sigma is d·√(2/2)·… computed exactly.
    d = 0.05
    medians = [[math.exp(-d), 1.0, math.exp(d)], [2 * math.exp(-d), 2.0, 2 * math.exp(d)]]
    floor, sigma = noise_floor(medians)
    assert sigma == pytest.approx(d)  # each case: ss = 2d², df = 2; pooled over both
    assert floor == pytest.approx(math.expm1(student_t_975(4) * math.sqrt(2) * d))
    assert noise_floor([[1.0, 1.0], [3.0, 3.0]]) == (0.0, 0.0)
    with pytest.raises(ValueError):
        noise_floor([[1.0]])


def test_noise_is_stored_with_the_calibration_and_older_caches_read_back() -> None:
    calibration = _calibration(_noise(0.12, contended=1))
    back = Calibration.from_dict(json.loads(json.dumps(calibration.to_dict())))
    assert back == calibration and back.noise is not None and back.noise.floor == 0.12
    old = calibration.to_dict()
    del old["noise"]
    assert Calibration.from_dict(old).noise is None
    bad = calibration.to_dict()
    bad["noise"]["spreads"] = [0.1]
    with pytest.raises(FieldError, match=r"noise\.spreads"):
        Calibration.from_dict(bad)
    assert "±12 %" in noise_line(calibration) and "busy machine" in noise_line(calibration)
    assert "not measured" in noise_line(_calibration(None))


def _own(noise: NoiseFloor, environment: Mapping[str, Any]) -> Calibration:
    """A calibration measured on the machine and stack ``environment`` describes (a run.json's)."""
    fingerprint = Environment.from_dict(environment).fingerprint()
    name = environment.get("gpu_name") or environment["cpu_model"]
    threads = environment["torch_threads"]
    return Calibration(fingerprint, "cpu", name, "2026-12-03T00:00:00Z", environment["torch"], threads, (), noise=noise)


def _side(path, floor: float | None, *, foreign: bool = False) -> Side:  # type: ignore[no-untyped-def]
    side = load_side(path, "base")

    def calibration(run: Run) -> Calibration | None:
        if floor is None:
            return None
        if foreign:  # measured on an H100 elsewhere, its run.json copied here
            return replace(_calibration(_noise(floor)), fingerprint="f" * 16, device="cuda:0", device_name="H100")
        return _own(_noise(floor), run.environment)

    return replace(side, runs=tuple(replace(s, run=replace(s.run, calibration=calibration(s.run))) for s in side.runs))


def test_a_calibration_of_another_machine_sets_no_floor_and_compare_says_so() -> None:
    """Issue 50 §3.2: runs whose run.json carried another machine's calibration (another fingerprint, cuda:0, a
    0.1 % floor) were judged with that floor, the output saying it was measured on this machine."""
    alien = compare_sides(_side(BASE, 0.001, foreign=True), _side(CURRENT, 0.001, foreign=True), Policy())
    assert alien.policy.noise_floor == DEFAULT_NOISE_FLOOR and alien.policy.floor_source == UNMEASURED_SOURCE
    ignored = [w for w in alien.warnings if "another machine" in w]
    assert len(ignored) == len(alien.base.runs) + len(alien.current.runs)
    own = compare_sides(_side(BASE, 0.001), _side(CURRENT, 0.001), Policy())
    assert own.policy.noise_floor == 0.001 and not [w for w in own.warnings if "another machine" in w]
    # One side's own floor still counts; the other side's foreign one does not.
    mixed = compare_sides(_side(BASE, 0.5, foreign=True), _side(CURRENT, 0.02), Policy())
    assert mixed.policy.noise_floor == 0.02


def test_compare_widens_by_the_larger_recorded_floor_and_says_so() -> None:
    plain = compare_sides(_side(BASE, None), _side(CURRENT, None), Policy())
    assert plain.policy.noise_floor == DEFAULT_NOISE_FLOOR and "the default" in plain.policy.floor_source
    measured = compare_sides(_side(BASE, 0.02), _side(CURRENT, 0.03), Policy())
    assert measured.policy.noise_floor == 0.03 and "attnbench calibrate" in measured.policy.floor_source
    assert measured.to_dict()["policy"]["noise_floor_source"] == measured.policy.floor_source
    given = compare_sides(_side(BASE, 0.02), _side(CURRENT, 0.03), Policy(noise_floor=0.01))
    assert given.policy.noise_floor == 0.01 and given.policy.floor_source == "given by --noise-floor"
    # The unmeasured default is the wider floor, and a wider floor can only widen the intervals: every case that
    # regresses against it regresses against the measured one too — and the 25 % slower lstm only against that.
    assert {c.key for c in plain.of("regressed")} <= {c.key for c in measured.of("regressed")}
    lstm = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"
    verdicts = {
        c.key.split("|d_model")[0]: (c.verdict, m.verdict) for c, m in zip(plain.cases, measured.cases, strict=True)
    }
    assert verdicts[lstm] == ("noisy", "regressed")


def test_a_floor_beyond_the_threshold_says_to_use_several_processes() -> None:
    wide = compare_sides(_side(BASE, 0.15), _side(CURRENT, 0.15), Policy())
    assert any("timing.processes" in w and "±15 %" in w for w in wide.warnings)
    assert not wide.of("same") or all(c.evidence != "samples" for c in wide.of("same"))
    narrow = compare_sides(_side(BASE, 0.02), _side(CURRENT, 0.02), Policy())
    assert not any("timing.processes" in w for w in narrow.warnings)


@pytest.mark.slow
def test_measure_noise_runs_each_round_in_a_fresh_process() -> None:
    # A budget a first train call slowed by a neighbouring test worker still leaves min_samples room in (at 0.3 s
    # one such warm-up left 4 ms, and the reference case honestly ended too_slow_for_budget).
    policy = quick_policy(target_ci=0.05, min_samples=5, min_time_s=0.02, max_case_s=1.0, warmup_max_s=0.1)
    cases = (tiny_case("lstm"), tiny_case("vanilla", mode="train"))
    heard: list[str] = []
    noise = measure_noise("cpu", 1, processes=2, cases=cases, policy=policy, progress=heard.append)
    assert noise.processes == 2 and noise.cases == tuple(c.key for c in cases)
    assert len(noise.spreads) == 2 and all(s >= 0 for s in noise.spreads)
    assert noise.floor >= 0 and math.isfinite(noise.floor)
    # A round the machine was busy for is taken again (beside another test worker it can be), up to twice the rounds
    # asked; the quiet rounds count up in order, and every round said what it was.
    quiet = [h for h in heard if "busy" not in h]
    assert quiet == [f"noise: process {i} of 2 done" for i in range(1, len(quiet) + 1)]
    assert len(quiet) == 2 or len(heard) == 4


def _scripted(monkeypatch: pytest.MonkeyPatch, rounds: list[tuple[float, int]]) -> list[int]:
    """measure_noise's rounds played from ``rounds`` ((median of both cases, contended timings) each, in order);
    returns the list the rounds taken are counted into."""
    taken: list[int] = []

    def fake_round(settings: object, cases: object) -> tuple[list[float], int]:
        median, contended = rounds[len(taken)]
        taken.append(1)
        return [median, 2 * median], contended

    monkeypatch.setattr(noise_module, "_round", fake_round)
    return taken


def test_a_round_on_a_busy_machine_is_taken_again_and_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # The second round ran beside a neighbour (contended, and 50 % slow): the floor is the quiet rounds'.
    taken = _scripted(monkeypatch, [(1.0, 0), (1.5, 2), (1.02, 0), (0.98, 0)])
    heard: list[str] = []
    noise = measure_noise("cpu", 1, processes=3, cases=(tiny_case("lstm"), tiny_case("gru")), progress=heard.append)
    assert len(taken) == 4 and noise.processes == 3 and noise.contended == 0
    assert noise.floor == pytest.approx(noise_floor([[1.0, 1.02, 0.98], [2.0, 2.04, 1.96]])[0])
    assert mentions(heard[1], "busy", values=(2,))  # 2 contended timings: that process is taken again
    assert numbers(heard[-1]) == [3, 3]  # process 3 of 3, done


def test_a_machine_that_stays_busy_gets_a_floor_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # Twice the rounds asked for, and still only one quiet: the floor is made of it and the first busy ones.
    taken = _scripted(monkeypatch, [(1.3, 1), (1.0, 0), (1.5, 3), (1.4, 1), (1.6, 2), (1.2, 1)])
    noise = measure_noise("cpu", 1, processes=3, cases=(tiny_case("lstm"), tiny_case("gru")))
    assert len(taken) == 6 and noise.processes == 3 and noise.contended == 1 + 3
    assert noise.floor == pytest.approx(noise_floor([[1.0, 1.3, 1.5], [2.0, 2.6, 3.0]])[0])
