"""The model family as one unit: every family found, its rules written once, and nothing else naming a model."""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

from attnbench.core.cases import Case
from attnbench.families.base import ExtraSpec, Family
from attnbench.families.catalogue import (
    FAMILIES,
    MODEL_NAMES,
    MODELS,
    PRESETS,
    cannot_build,
    kind_of,
    no_effect,
    option_of,
    spec_of,
)
from attnbench.families.extras import EXTRAS, declared
from attnbench.families.user.spec import UserModel
from tests.support import ROOT, heads_kv_of, tiny_case


def test_every_family_folder_is_found_and_owns_its_models() -> None:
    found = {f.name for f in FAMILIES}
    folders = {Path(p).parent.name for p in glob.glob(str(ROOT / "attnbench/families/*/spec.py"))}
    defining = {
        f for f in folders if re.search(r"^FAMILY = ", (ROOT / f"attnbench/families/{f}/spec.py").read_text(), re.M)
    }
    assert found == defining and "user" not in defining  # the user family is known by its case, not listed
    for family in FAMILIES:
        assert (ROOT / f"attnbench/families/{family.name}/layers.py").is_file(), family.name
    assert all(isinstance(f, Family) and f.models for f in FAMILIES)
    assert list(MODELS) == [spec.name for f in FAMILIES for spec in f.models]
    assert len(set(MODEL_NAMES)) == len(MODEL_NAMES)
    for preset in PRESETS.values():
        assert preset.model is None or preset.model in MODELS


def test_an_option_name_means_one_type_everywhere() -> None:
    types: dict[str, type] = {}
    for spec in MODELS.values():
        for option in spec.options:
            assert types.setdefault(option.name, option.type) is option.type, option.name


def test_no_effect_and_cannot_build_are_the_two_checks() -> None:
    assert no_effect("lstm", "vocab", {}) is not None  # vocab below scope model changes nothing
    assert no_effect("lstm", "vocab", {"scope": "model"}) is None
    problem = no_effect("linear-attn", "chunk", {"form": "recurrent"})
    assert problem is not None and problem.option == "chunk"
    rope = cannot_build(tiny_case("lstm", positional="rope"))
    assert rope is not None and rope.option == "positional" and "sinusoidal or learned" in rope.hint
    odd = cannot_build(tiny_case("sdpa", d_model=6, heads=2, positional="rope"))  # head_dim 3
    assert odd is not None and "head_dim" in odd.message
    short = cannot_build(tiny_case("sdpa", positional="learned", max_len=8))  # seq_len 16
    assert short is not None and short.option == "max_len"
    assert cannot_build(tiny_case("sdpa", positional="learned", max_len=16)) is None


def test_a_user_model_is_known_by_its_case() -> None:
    user = UserModel("pkg.mod:build", "recurrent", "config")
    case = Case("my-rnn", "forward", "float32", "cpu", 2, 16, 32, 4, 1, True, (("width", 2),), user.definition())
    assert kind_of(case) == "recurrent" and option_of(case, "width") == 2 and heads_kv_of(case) == 4
    spec = spec_of(case)
    assert spec.name == "my-rnn" and spec.source == "config" and spec.option("width") is not None
    assert cannot_build(case) is None
    again = Case.from_dict(json.loads(json.dumps(case.to_dict())))
    assert again == case and again.key == case.key
    assert "user" not in tiny_case("lstm").to_dict()  # built-in rows read as they always did


def test_extras_are_declared_once_with_a_type_and_unit() -> None:
    everything = declared()
    assert len(everything) == len(EXTRAS) + len({s.name for f in FAMILIES for s in f.extras} - {e.name for e in EXTRAS})
    assert {"rnn_path", "sdpa_kernel", "gqa_path", "flops", "state_bytes"} <= set(everything)
    assert ExtraSpec("x", int, "", "").fits(3) and not ExtraSpec("x", int, "", "").fits(True)
    assert ExtraSpec("x", float, "s", "").fits(3) and not ExtraSpec("x", str, "", "").fits(3)


def test_every_extra_a_stored_run_holds_is_declared() -> None:
    runs = [
        *glob.glob(str(ROOT / "tests/data/runs/*/results.jsonl")),
        *glob.glob(str(ROOT / "results/*/results.jsonl")),
    ]
    assert runs
    lines = [line for path in runs for line in Path(path).read_text().splitlines() if line]
    keys = {key for line in lines for key in json.loads(line).get("extra", {})}
    assert keys <= set(declared()), sorted(keys - set(declared()))
