"""analysis.presets and its summary.md section (issue 49): a published model's decode state across its whole stack,
per sequence and per token of context, by its config.json's arithmetic; and the crossover between its own
recurrent and attention mixers in a run's rows."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from attnbench.analysis.presets import PresetsSection, preset_crossovers, presets_section, stack_state
from attnbench.core.cases import Case
from attnbench.families.catalogue import PUBLISHED, published_problem
from attnbench.report.presets_md import presets_markdown
from attnbench.results.contention import Contention
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result


def state(name: str, dtype: str = "bfloat16"):  # type: ignore[no-untyped-def]
    found = stack_state(PUBLISHED[name], dtype, "sdpa")
    assert found is not None
    return found


def test_llama_pays_its_kv_cache_per_token_across_32_layers() -> None:
    # 2 (K and V) × 32 layers × 8 key/value heads × 128 × 2 bytes
    assert state("llama3.1-8b").per_token_bytes == 2 * 32 * 8 * 128 * 2 == 131_072


def test_qwen3_next_pays_per_token_only_in_its_12_attention_layers() -> None:
    qwen = state("qwen3-next-80b-a3b")
    assert qwen.per_token_bytes == 2 * 12 * 2 * 256 * 2
    # 36 Gated DeltaNet layers: the conv's last 3 inputs of 2·2048 + 4096 channels (bf16) and 32 value heads'
    # 128 × 128 memory (float32); the 12 attention layers' one slot of the new token
    assert qwen.per_sequence_bytes == 36 * (3 * 8192 * 2 + 32 * 128 * 128 * 4) + 2 * 12 * 2 * 256 * 2
    assert qwen.per_token_bytes < state("llama3.1-8b").per_token_bytes / 5
    assert state("nemotron-h-8b").per_token_bytes == 2 * 4 * 8 * 128 * 2  # 4 attention layers of 28


def test_a_recurrent_stack_pays_nothing_per_token() -> None:
    for name in ("mamba2-2.7b", "rwkv7-2.9b"):
        assert state(name).per_token_bytes == 0 and state(name).per_sequence_bytes > 0
    mamba = state("mamba2-2.7b", "float32")
    # 64 layers × (the conv's 4 inputs of 5120 + 2·128 channels, 80 heads × 64 × 128 state), float32
    assert mamba.per_sequence_bytes == 64 * ((5120 + 256) * 4 + 80 * 64 * 128) * 4


def test_deepseek_v3s_latent_cache_is_below_llamas_kv_cache_per_token_and_layer() -> None:
    """Issue 49's check, at scope core: MLA caches kv_lora_rank + qk_rope_head_dim = 576 values a token and layer,
    GQA 2 × 8 × 128 = 2048; both equal their formulas."""
    if published_problem(PUBLISHED["deepseek-v3"], ("sdpa",)) is not None:
        pytest.skip("deepseek-v3 needs the mla family (runs once it is merged)")
    deepseek, llama = state("deepseek-v3"), state("llama3.1-8b")
    assert deepseek.per_token_bytes == 61 * (512 + 64) * 2
    assert deepseek.per_token_bytes / 61 < llama.per_token_bytes / 32 == 2 * 8 * 128 * 2


@pytest.mark.parametrize("name", ["kimi-linear-48b-a3b", "deepseek-v3", "gpt-oss-20b"])
def test_a_model_whose_family_is_not_here_has_no_state_yet(name: str) -> None:
    if published_problem(PUBLISHED[name], ("sdpa",)) is None:
        assert stack_state(PUBLISHED[name], "bfloat16", "sdpa") is not None
    else:
        assert stack_state(PUBLISHED[name], "bfloat16", "sdpa") is None


def row(model: str, n: int, median_s: float, options: dict[str, object], heads: int | None) -> Result:
    case = Case(model, "forward", "float32", "cpu", 1, n, 2048, heads, 1, True, tuple(sorted(options.items())))  # type: ignore[arg-type]
    samples = tuple(median_s for _ in range(11))
    return Result(case, "ok", measurement=Measurement(samples, 1, 3, 0.0, True, "converged", 0.01))  # type: ignore[arg-type]


def qwen_rows(times: dict[int, tuple[float, float]]) -> list[Result]:
    preset = PUBLISHED["qwen3-next-80b-a3b"]
    gdn, attention = preset.mixer("linear_attention"), preset.mixer("full_attention")
    out = []
    for n, (t_gdn, t_attention) in times.items():
        out.append(row("gated-deltanet", n, t_gdn, {**dict(gdn.options), "preset": preset.name}, 16))
        out.append(row("sdpa", n, t_attention, {**dict(attention.options), "preset": preset.name}, 16))
    return out


def test_a_models_own_crossover_is_found_in_its_rows() -> None:
    rows = qwen_rows({512: (2.0, 1.0), 2048: (4.0, 4.0 * 1.5), 8192: (8.0, 64.0)})
    (found,) = preset_crossovers(rows)
    assert (found.recurrent, found.attention, found.mode) == ("linear_attention", "full_attention", "forward")
    assert len(found.at) == 1 and 512 < found.at[0] < 2048 and not found.estimate
    assert found.line is not None and found.line.seq_lens == (512, 2048, 8192)
    assert found.line.ratios[-1] == pytest.approx(64.0 / 8.0)  # attention's time over the recurrent mixer's
    lines = presets_markdown(presets_section(rows))
    assert any("qwen3-next-80b-a3b" in line and "48 KiB" in line for line in lines)  # float32 rows
    (crossing,) = [line for line in lines if line.startswith("- ")]
    assert "qwen3-next-80b-a3b" in crossing and {"512", "2048"} <= set(re.findall(r"\d+", crossing))


def contended(result: Result) -> Result:
    return replace(result, contention=Contention(True, ("other processes kept 1.9 of 2 cores busy",), 1.0))


def test_a_crossover_on_a_busy_machine_is_a_marked_estimate_with_its_interval() -> None:
    """Issue 51's spirit: every row contended is no evidence, but the crossover between measured lengths is still
    given, as an estimate, with the lengths it lies between."""
    rows = [contended(r) for r in qwen_rows({512: (2.0, 1.0), 2048: (4.0, 6.0), 8192: (8.0, 64.0)})]
    assert all(r.contended for r in rows)
    (found,) = preset_crossovers(rows)
    assert found.estimate and found.line is not None and found.line.seq_lens == ()
    (crossing,) = found.evidence.crossings if found.evidence else ()
    assert (crossing.low_x, crossing.high_x) == (512, 2048) and 512 < crossing.x < 2048
    assert found.at == (crossing.x,)


def test_a_mixer_untimed_at_every_length_still_gets_its_line() -> None:
    rows = qwen_rows({512: (2.0, 1.0)})
    untimed = [replace(r, status="too_slow_for_budget", measurement=None) if r.case.model == "gated-deltanet" else r
               for r in rows]  # fmt: skip
    (found,) = preset_crossovers(untimed)
    assert found.line is None and found.at == () and not found.estimate


def test_the_state_table_lists_a_model_it_cannot_count() -> None:
    section = PresetsSection((("qwen3-next-80b-a3b", None),), ())
    table = [row for line in presets_markdown(section) for row in line.splitlines() if row.startswith("| ")]
    assert len(table) == 2 and table[1].split("|")[1].strip() == "qwen3-next-80b-a3b"  # the header, and the model


def test_a_run_without_published_presets_has_no_section() -> None:
    plain = Case("sdpa", "forward", "float32", "cpu", 1, 64, 64, 4, 1, True)
    samples = tuple(1.0 for _ in range(11))
    result = Result(plain, "ok", measurement=Measurement(samples, 1, 3, 0.0, True, "converged", 0.01))  # type: ignore[arg-type]
    assert presets_markdown(presets_section([result])) == [] and preset_crossovers([result]) == []
