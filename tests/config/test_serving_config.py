"""The serving questions in a config (issue 41): memory_budget, prefill_chunk, draft, accept and packing, crossed
into their modes' cases, each refused where no mode of the config uses it. No torch here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import Experiment, load_experiment_text
from attnbench.config.serving import draw_lengths
from attnbench.core.cases import MAX_PACKED
from attnbench.core.errors import ConfigError
from tests.support import tiny_config

runner = CliRunner()
SERVING = {
    "models": ["lstm", "sdpa-flash"],
    "modes": ["capacity", "prefill", "verify", "forward"],
    "causal": True,
    "memory_budget": "64MiB",
    "prefill_chunk": [0, 4],
    "draft": [2, 4],
    "accept": [0, 3],
    "packing": [5, 12, 3],
}


def serving(**changes: object) -> str:
    return tiny_config("serving", **{**SERVING, **changes})


def load(text: str) -> Experiment:
    return load_experiment_text(text, "serving.yaml")


def refusal(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text)
    return caught.value


def test_each_serving_mode_crosses_its_parameters_like_a_grid_axis() -> None:
    cases = load(serving()).cases("cpu")
    by_mode = {mode: [c for c in cases if c.model == "lstm" and c.mode == mode] for mode in SERVING["modes"]}
    assert [(c.seq_len, c.batch, c.serving) for c in by_mode["capacity"]] == [
        (n, 1, (("memory_budget", 64 * 2**20),)) for n in (8, 16)
    ]
    assert [(c.param("prefill_chunk"), c.seq_len) for c in by_mode["prefill"]] == [(0, 8), (0, 16), (4, 8), (4, 16)]
    # accept 3 with draft 2 is left out; each pair's lengths in turn (seq_len innermost)
    assert [(c.param("draft"), c.param("accept"), c.seq_len) for c in by_mode["verify"]] == [
        (2, 0, 8), (2, 0, 16), (4, 0, 8), (4, 0, 16), (4, 3, 8), (4, 3, 16)
    ]  # fmt: skip
    # The packed lengths stand in for batch × seq_len: one forward case, whatever the grid's lengths.
    (packed,) = by_mode["forward"]
    assert (packed.batch, packed.seq_len, packed.packing) == (3, 12, (5, 12, 3))
    assert all(c.serving == () and c.packing == () for c in cases if c.mode == "forward" and not c.packing) is True
    assert all(c.causal for c in cases if c.mode != "forward")


def test_a_config_without_the_serving_keys_resolves_as_it_always_did() -> None:
    plain = load(tiny_config())
    assert not {"memory_budget", "prefill_chunk", "draft", "accept", "packing"} & set(plain.resolved)
    resolved = load(serving()).resolved
    assert resolved["memory_budget"] == 64 * 2**20 and resolved["packing"] == [5, 12, 3]
    again = load(yaml.safe_dump(resolved))  # the resolved config is itself a config, with the same cases
    assert again.sha256 == load(serving()).sha256 and again.cases("cpu") == load(serving()).cases("cpu")


@pytest.mark.parametrize(
    ("modes", "key"),
    [
        (["capacity", "prefill", "forward"], "draft"),
        (["prefill", "verify", "forward"], "memory_budget"),
        (["capacity", "verify", "forward"], "prefill_chunk"),
        (["capacity", "prefill", "verify"], "packing"),
    ],
)
def test_a_key_no_mode_uses_is_refused_at_that_key(modes: list[str], key: str) -> None:
    error = refusal(serving(modes=modes))
    assert error.key == key and f"{key} has no effect" in error.problem


def test_a_cpu_capacity_needs_a_budget_and_a_verify_needs_its_drafts() -> None:
    error = refusal(serving(memory_budget=None))
    assert error.key == "modes[0]" and "memory_budget" in error.problem
    assert load(serving(device="auto", memory_budget=None)).cases("cpu")[0].param("memory_budget") == 0
    assert refusal(serving(draft=None)).key == "modes[2]"
    assert refusal(serving(accept=[0, 5])).key == "accept[1]"
    assert refusal(serving(memory_budget="4 gigs")).key == "memory_budget"
    assert refusal(serving(prefill_chunk=[4, 4])).key == "prefill_chunk[1]"
    # A preset asks the serving questions the config asks, with its keys (issue 49: every mode of a preset works).
    asked = load(serving(presets=["lstm-110m"])).cases("cpu")
    assert "capacity" in {c.mode for c in asked if ("preset", "lstm-110m") in c.options}


def test_packed_lengths_may_be_drawn_to_fill_a_token_budget() -> None:
    drawn = {"lognormal": {"mean": 20, "sigma": 0.5}, "tokens": 300, "seed": 3}
    (packed,) = [c for c in load(serving(packing=drawn)).cases("cpu") if c.packing and c.model == "lstm"]
    assert sum(packed.packing) == 300 and packed.packing == draw_lengths(20, 0.5, 300, 3)
    assert draw_lengths(20, 0.5, 300, 3) != draw_lengths(20, 0.5, 300, 4)
    assert draw_lengths(7, 0.0, 20, 0) == (7, 7, 6)  # no spread: the mean, the last one cut to fit
    error = refusal(serving(packing={"lognormal": {"mean": 1, "sigma": 0}, "tokens": MAX_PACKED + 1}))
    assert error.key == "packing.tokens"
    assert refusal(serving(packing={"lognormal": {"mean": 1}, "tokens": 9})).key == "packing.lognormal.sigma"


def test_validate_refuses_an_unused_key_with_one_error_line(tmp_path: Path) -> None:
    config = tmp_path / "serving.yaml"
    config.write_text(serving(modes=["forward"], memory_budget=None, prefill_chunk=None, packing=None, accept=None))
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'draft'" in errors[0]
    config.write_text(serving())
    assert runner.invoke(app, ["validate", str(config)]).exit_code == 0


def test_a_sweep_that_resolves_to_a_cpu_refuses_a_capacity_without_a_budget(tmp_path: Path) -> None:
    config = tmp_path / "serving.yaml"
    config.write_text(serving(device="auto", memory_budget=None))
    result = runner.invoke(app, ["sweep", str(config), "--device", "cpu", "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "memory_budget" in result.output


@pytest.mark.parametrize("budget", ["1kiB", "1 kiB", "9" * 400, "9" * 400 + "GiB"])
def test_a_budget_unit_typo_or_overflow_is_one_error_line(tmp_path: Path, budget: str) -> None:
    """Issue 50 §3.5: ``1kiB`` was a KeyError and 400 digits an OverflowError, in a config and through --set."""
    assert refusal(serving(memory_budget=budget)).key == "memory_budget"
    config = tmp_path / "serving.yaml"
    config.write_text(serving())
    for args in (["validate", str(config)], ["sweep", str(config), "--dry-run"]):
        extra = [] if args[0] == "validate" else ["--set", f"memory_budget={budget}"]
        if args[0] == "validate":
            config.write_text(serving(memory_budget=budget))
        out = runner.invoke(app, [*args, *extra])
        assert out.exit_code == 2 and not isinstance(out.exception, KeyError | OverflowError), out.output
        assert "memory_budget" in out.output
        config.write_text(serving())


def test_a_budget_this_machine_cannot_hold_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Issue 50 §3.4: ``memory_budget: 1024TiB`` (the cap), or more than the machine's memory, was tried: 32 GiB and
    8 GiB allocations, and an oom row the budget caused. validate and sweep (a dry run too) refuse it, by key."""
    from attnbench.core.units import GIB
    from attnbench.host.memory import check_budget, host_memory_bytes

    total = host_memory_bytes()
    assert total is not None and total > 0
    config = tmp_path / "serving.yaml"
    for budget in ("1024TiB", f"{total * 3 // 2}"):
        config.write_text(serving(memory_budget=budget, device="cpu"))
        for args in (["validate", str(config)], ["sweep", str(config), "--dry-run", "--out", str(tmp_path / "o")]):
            out = runner.invoke(app, args)
            assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
            assert "memory_budget" in out.output
        assert not (tmp_path / "o").exists()
    config.write_text(serving(device="cpu"))  # 64 MiB: held
    assert runner.invoke(app, ["validate", str(config)]).exit_code == 0
    with pytest.raises(ConfigError) as caught:
        check_budget(9 * GIB, "cpu", total=8 * GIB)
    assert caught.value.key == "memory_budget"
    check_budget(9 * GIB, "cuda:0", total=8 * GIB)  # a GPU's is held to the device where the search runs
    check_budget(7 * GIB, "cpu", total=8 * GIB)
