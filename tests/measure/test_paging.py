"""KV caches as engines keep them (issue 52): a kept or paged cache is read chunk by chunk, each chunk converted (and
gathered through the page table) on its own, so a step's working memory is bounded; a paged cache holds whole
pages; a decode through it is the contiguous one's."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.families import states
from attnbench.families.catalogue import family_of
from attnbench.families.hybrid.spec import HybridModel
from attnbench.families.registry import build_model
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import KVCache, decodable, prefill, tensor_bytes
from attnbench.timing import paging
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.precision import PaddedState, keeping
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import tiny_case

CONTEXT, STEPS = 40, 12


def model(window: int = 0, heads_kv: int = 0) -> tuple[Any, torch.Tensor]:
    options: dict[str, Any] = {"window": window} if window else {}
    if heads_kv:
        options["heads_kv"] = heads_kv
    c = tiny_case("sdpa", mode="decode", seq_len=CONTEXT, d_model=64, heads=4, layers=2, causal=True, **options)
    torch.manual_seed(0)
    return build_model(c, "cpu", torch.float32), torch.randn(2, CONTEXT + STEPS, 64)


def decode(m: Any, x: torch.Tensor, kv: str | None = None, pages: int = 0) -> tuple[torch.Tensor, Any]:
    outputs = []
    with torch.inference_mode(), keeping(kv, None, pages):
        state = prefill(m, x[:, :CONTEXT], CONTEXT + STEPS)
        for t in range(CONTEXT, CONTEXT + STEPS):
            outputs.append(decodable(m).step(x[:, t : t + 1], state))
            state.advance()
    return torch.cat(outputs, dim=1), state


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Slots × sequences each chunk a step converts, with chunks of a few slots (so a step reads several)."""
    sizes: list[int] = []
    monkeypatch.setattr(paging, "CHUNK_BYTES", 2 * (2 * 4 * 16 * 4 + 2 * 4 * 4) * 8)  # 8 slots at batch 2
    for kind in (paging.EngineCache, paging.PagedCache):

        def spy(
            self: Any, which: int, start: int, stop: int, rows: slice = slice(None), real: Any = kind.chunk
        ) -> torch.Tensor:
            out = real(self, which, start, stop, rows)
            sizes.append((stop - start) * out.shape[0])
            return out

        monkeypatch.setattr(kind, "chunk", spy)
    return sizes


@pytest.mark.parametrize(("window", "heads_kv", "pages"), [(0, 0, 16), (0, 2, 5), (8, 0, 4), (0, 0, 1)])
def test_a_paged_decode_is_the_contiguous_one(spied: list[int], window: int, heads_kv: int, pages: int) -> None:
    m, x = model(window, heads_kv)
    full, _ = decode(m, x)
    paged, state = decode(m, x, pages=pages)
    assert all(isinstance(layer, paging.PagedCache) for layer in state.layers)
    assert spied and max(spied) <= 32  # read through the page table, a few slots × sequences at a time (of 104)
    torch.testing.assert_close(paged, full, rtol=1e-5, atol=1e-5)


def test_a_kept_cache_converts_a_chunk_at_a_time(spied: list[int]) -> None:
    m, x = model()
    full, _ = decode(m, x)
    kept, state = decode(m, x, "int8")
    assert all(type(layer) is paging.EngineCache for layer in state.layers)
    assert max(spied) <= 16 and len(spied) >= 2 * math.ceil(CONTEXT / 8)  # K and V, several chunks per step
    assert 0 < float((kept - full).abs().max()) < 0.05


@pytest.mark.parametrize(("kv", "pages"), [("int8", 0), ("float8_e4m3fn", 4)])
def test_short_sequences_are_read_whole_several_at_a_time(kv: str, pages: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a chunk holds several sequences' filled slots, a step reads them whole, a group of sequences per call
    (no split-K), and decodes as it does one slot range at a time."""
    m, x = model()
    x = x.repeat(4, 1, 1)  # 8 sequences
    split, _ = decode(m, x, kv, pages)  # CHUNK_BYTES: 4 MiB, so all 8 sequences in one call
    calls: list[tuple[int, int, int]] = []
    real = paging.PagedCache.chunk if pages else paging.EngineCache.chunk

    def spy(self: Any, which: int, start: int, stop: int, rows: slice = slice(None)) -> torch.Tensor:
        out = real(self, which, start, stop, rows)
        calls.append((out.shape[0], start, stop))
        return out

    monkeypatch.setattr(paging.PagedCache if pages else paging.EngineCache, "chunk", spy)
    one_row = 2 * 4 * 16 * 4 + 2 * 4 * 4  # a slot of one sequence converted, and its scores
    monkeypatch.setattr(paging, "CHUNK_BYTES", one_row * (CONTEXT + STEPS) * 3)  # three whole sequences
    grouped, _ = decode(m, x, kv, pages)
    assert {rows for rows, _, _ in calls} == {3, 2}  # 8 sequences: 3, 3, 2
    assert all(start == 0 for _, start, _ in calls)  # each group's slots in one call, never split
    torch.testing.assert_close(grouped, split, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kept", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_cache_converts_through_its_table_bit_for_bit(
    kept: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = torch.arange(256, dtype=torch.uint8).view(kept)
    made: list[torch.dtype] = []
    real = states.float8_table

    def spy(stored: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
        made.append(stored)
        return real(stored, dtype)

    monkeypatch.setattr(states, "float8_table", spy)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        converted = states._converted(every.view(2, 8, 16), dtype)
        torch.testing.assert_close(converted, every.to(dtype).view(2, 8, 16), equal_nan=True, rtol=0, atol=0)
    m, x = model()
    decode(m, x, str(kept).removeprefix("torch."), 4)
    assert len(made) > 3 and set(made) == {kept}  # the table ran, in the decode too


@pytest.mark.parametrize(("kv", "pages"), [(None, 16), ("int8", 16), (None, 7)])
def test_a_paged_cache_holds_whole_pages(kv: str | None, pages: int) -> None:
    m, _ = model()
    span = CONTEXT + 1
    with torch.inference_mode(), keeping(kv, None):
        contiguous = tensor_bytes(decodable(m).init_state(3, span))
    with torch.inference_mode(), keeping(kv, None, pages):
        state = decodable(m).init_state(3, span)
    slot = 2 * 4 * 16 * (1 if kv else 4)  # K and V of one position: heads x head_dim
    pages_held = math.ceil(span / pages)
    empty = 3 * (pages_held * pages - span) * slot + 3 * pages_held * 8  # per layer: the last pages' tails, the table
    assert tensor_bytes(state) == contiguous + 2 * empty
    assert tensor_bytes(state) - contiguous <= 2 * 3 * (pages * slot + pages_held * 8)  # within a page per sequence
    assert all(layer.table.shape == (3, math.ceil(span / pages)) for layer in state.layers)


def test_a_cache_kept_as_it_computes_is_the_plain_one() -> None:
    m, _ = model()
    with torch.inference_mode(), keeping("float32", None):
        state = decodable(m).init_state(1, 8)
    assert all(type(layer) is KVCache for layer in state.layers)


@pytest.mark.parametrize(("kv", "pages"), [(None, 16), ("int8", 16), ("bfloat16", 7), (None, 0)])
def test_the_state_bytes_formula_counts_whole_pages(kv: str | None, pages: int) -> None:
    kept = {"kv_dtype": kv} if kv else {}
    c = tiny_case("sdpa-flash", mode="decode", seq_len=CONTEXT, d_model=64, heads=4, layers=2, causal=True)
    c = replace(c, kept=tuple(sorted({**kept, **({"page_tokens": str(pages)} if pages else {})}.items())))
    torch.manual_seed(0)
    m = build_model(c, "cpu", torch.float32)
    with torch.inference_mode(), keeping(kv, None, pages):
        held = tensor_bytes(decodable(m).init_state(c.batch, c.span))
    assert held == state_bytes(c)


HYBRID = HybridModel(("mamba2", "mamba2", "mamba2", "sdpa-flash"))


def hybrid(*kept: tuple[str, str], dtype: str = "bfloat16") -> Case:
    c = tiny_case("sdpa", mode="decode", dtype=dtype, seq_len=CONTEXT, d_model=64, heads=4, layers=4, causal=True)
    return replace(c, model="hy", definition=HYBRID.definition(), kept=tuple(sorted(kept)))


@pytest.mark.parametrize(
    "kept",
    [
        (("page_tokens", "16"),),
        (("hybrid_pages", "aligned"),),
        (("hybrid_pages", "aligned"), ("page_tokens", "16"), ("state_dtype", "bfloat16")),
        (("hybrid_pages", "aligned"), ("kv_dtype", "int8"), ("page_tokens", "16")),
    ],
)
def test_a_hybrids_aligned_pages_hold_its_largest_state_and_pad_every_state_to_one(kept: tuple[Any, ...]) -> None:
    c = hybrid(*kept)
    tokens, page = family_of(c).page_layout(c)
    torch.manual_seed(0)
    m = build_model(c, "cpu", torch.bfloat16)
    with torch.inference_mode(), keeping(c.kept_dtype("kv_dtype"), c.kept_dtype("state_dtype"), tokens, page):
        state = decodable(m).init_state(c.batch, c.span)
    assert tensor_bytes(state) == state_bytes(c)  # the formula is what is allocated, padding and tables included
    caches = [layer for layer in leaves(state) if isinstance(layer, KVCache)]
    states = [layer for layer in leaves(state) if not isinstance(layer, KVCache)]
    assert len(caches) == 1 and len(states) == 3
    if ("hybrid_pages", "aligned") not in kept:
        assert page == 0 and tokens == 16 and not any(isinstance(s, PaddedState) for s in states)
        return
    separate = hybrid(*(item for item in kept if item[0] != "hybrid_pages"))
    per_token = 2 * 4 * 16 * (1 if c.kept_dtype("kv_dtype") else 2)  # K and V of a position, 4 heads of 16
    largest = max(tensor_bytes(s.inner) for s in states) // c.batch  # type: ignore[attr-defined]
    assert tokens % 16 == 0 and page == tokens * per_token >= largest > page - 16 * per_token  # vLLM's smallest
    assert all(isinstance(s, PaddedState) and tensor_bytes(s) == c.batch * page for s in states)
    assert cast(paging.PagedCache, caches[0]).page_tokens == tokens
    assert (state_bytes(c) or 0) > (state_bytes(separate) or 0)  # alignment wastes bytes at this short context


def leaves(state: Any) -> list[Any]:
    body = getattr(state, "body", state)
    found = []
    for layer in getattr(body, "layers", [body]):
        found.extend(leaves(layer) if hasattr(layer, "layers") or hasattr(layer, "body") else [layer])
    return found


def test_an_aligned_hybrid_decodes_as_the_separate_one() -> None:
    outputs = []
    for kept in [(("page_tokens", "16"),), (("hybrid_pages", "aligned"), ("page_tokens", "16"))]:
        c = hybrid(*kept, dtype="float32")
        torch.manual_seed(0)
        m = build_model(c, "cpu", torch.float32)
        x = torch.randn(2, CONTEXT + 4, 64, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode(), keeping(None, None, *family_of(c).page_layout(c)):
            state = prefill(m, x[:, :CONTEXT], CONTEXT + 4)
            for t in range(CONTEXT, CONTEXT + 4):
                outputs.append(decodable(m).step(x[:, t : t + 1], state))
                state.advance()
    torch.testing.assert_close(torch.cat(outputs[:4], 1), torch.cat(outputs[4:], 1))


def test_a_paged_decode_row_reads_through_its_table_and_says_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    real = paging.PagedCache.chunk

    def spy(self: paging.PagedCache, which: int, start: int, stop: int, rows: slice = slice(None)) -> torch.Tensor:
        read.append(stop - start)
        return real(self, which, start, stop, rows)

    monkeypatch.setattr(paging.PagedCache, "chunk", spy)
    c = tiny_case("sdpa-flash", mode="decode", seq_len=CONTEXT, d_model=64, heads=4, layers=2, causal=True)
    c = replace(c, kept=(("page_tokens", "16"),))
    policy = TimingPolicy(min_samples=3, min_time_s=0.01, max_case_s=0.5, warmup_max_s=0.05, target_ci=0.2)
    result = TorchExecutor(ExecutorSettings("cpu", replace(policy, cache="warm"), threads=1, telemetry="off")).run(c)
    assert result.status in ("ok", "too_slow_for_budget"), result.reason
    assert read and result.extra["state_bytes"] == state_bytes(c)
    if result.ok:
        assert result.extra["kept_error_max"] < 1e-4  # pages change where K and V lie, not what attention computes
