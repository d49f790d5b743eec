"""Mode prefix in a config (issue 52 item 3): prefix_tokens, requests and checkpoint_every crossed like grid axes
into its cases, checkpoint_every only into the models it changes; each key checked, one error line. No torch here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import Experiment, load_experiment_text
from attnbench.core.errors import ConfigError
from tests.support import tiny_config

runner = CliRunner()
PREFIX = {
    "models": ["lstm", "sdpa-flash"],
    "modes": ["prefix"],
    "causal": True,
    "grid": {"batch": [2], "seq_len": [16, 32]},
    "prefix_tokens": [4, 8],
    "requests": [2, 8],
    "checkpoint_every": [0, 4],
}


def config(**changes: object) -> str:
    return tiny_config("prefix", **{**PREFIX, **changes})


def load(text: str) -> Experiment:
    return load_experiment_text(text, "prefix.yaml")


def refusal(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text)
    return caught.value


def test_the_prefix_keys_cross_like_grid_axes_and_checkpoints_only_where_they_change_something() -> None:
    cases = load(config()).cases("cpu")
    lstm = [c for c in cases if c.model == "lstm"]
    attention = [c for c in cases if c.model == "sdpa-flash"]
    assert len(lstm) == 2 * 2 * 2 * 2  # prefix_tokens × requests × checkpoint_every × seq_len
    assert {(c.param("prefix_tokens"), c.param("requests"), c.param("checkpoint_every")) for c in lstm} == {
        (p, m, c) for p in (4, 8) for m in (2, 8) for c in (0, 4)
    }
    # Attention shares its cache however often a recurrent state would be checkpointed: one case, not two.
    assert len(attention) == 2 * 2 * 2 and {c.param("checkpoint_every") for c in attention} == {0}
    assert all(c.batch == 1 and c.causal for c in cases)  # the requests are the sequences
    assert {c.tokens for c in lstm if c.seq_len == 16 and c.param("requests") == 8} == {8 * 16}


def test_checkpoint_every_left_out_keeps_none_and_the_config_resolves_as_given() -> None:
    text = config(checkpoint_every=None)
    experiment = load(text)
    assert {c.param("checkpoint_every") for c in experiment.cases("cpu")} == {0}
    assert "checkpoint_every" not in experiment.resolved
    again = load(yaml.safe_dump(experiment.resolved))
    assert again.sha256 == experiment.sha256 and again.cases("cpu") == experiment.cases("cpu")


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"requests": None}, "modes[0]"),  # a prefix needs its requests
        ({"prefix_tokens": None}, "modes[0]"),
        ({"prefix_tokens": [4, 16]}, "prefix_tokens[1]"),  # not shorter than seq_len 16
        ({"prefix_tokens": [4, 4]}, "prefix_tokens[1]"),
        ({"requests": [0]}, "requests[0]"),
        ({"checkpoint_every": [-1]}, "checkpoint_every[0]"),
        ({"modes": ["prefill"]}, "prefix_tokens"),  # no mode uses it
    ],
)
def test_each_prefix_key_is_checked_at_its_key(changes: dict[str, object], key: str) -> None:
    assert refusal(config(**changes)).key == key


@pytest.mark.parametrize(
    "changes",
    [{"requests": None}, {"prefix_tokens": [32]}, {"requests": ["many"]}, {"modes": ["decode"]}],
    ids=["missing", "too-long", "not-a-count", "unused"],
)
def test_validate_refuses_a_bad_prefix_key_with_one_error_line(tmp_path: Path, changes: dict[str, object]) -> None:
    path = tmp_path / "prefix.yaml"
    path.write_text(config(**changes))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1
    path.write_text(config())
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0


def test_the_committed_prefix_config_validates_with_every_decoding_family() -> None:
    path = Path(__file__).parents[2] / "configs" / "serving-prefix-cpu.yaml"
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    cases = load(path.read_text(encoding="utf-8")).cases("cpu")
    assert {c.mode for c in cases} == {"prefix"}
    assert {c.param("requests") for c in cases} == {8}
    hybrid = [c for c in cases if c.definition is not None]
    assert {c.param("checkpoint_every") for c in hybrid} == {0, 128}


def test_states_this_machine_cannot_hold_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """Both strategies' states are allocated at once: past the machine's memory, refused by validate and by a sweep
    (a dry run too), at requests; within it, allowed."""
    from attnbench.host.memory import check_prefix_states

    cases = load(config()).cases("cpu")
    check_prefix_states(cases, "cpu", total=2**40)
    with pytest.raises(ConfigError) as caught:
        check_prefix_states(cases, "cpu", total=2**10)
    assert caught.value.key == "requests"
    check_prefix_states(cases, "cuda", total=2**10)  # a GPU's states meet its memory where they are allocated
    path = tmp_path / "prefix.yaml"
    path.write_text(config(grid={"batch": [1], "seq_len": [2**21]}, requests=[4096], models=["sdpa-flash"]))
    for args in (["validate", str(path)], ["sweep", str(path), "--dry-run", "--out", str(tmp_path / "o")]):
        out = runner.invoke(app, args)
        assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
        assert len([line for line in out.output.splitlines() if line.startswith("error:")]) == 1
    assert not (tmp_path / "o").exists()
