"""KV caches and recurrent states stored narrower than they compute (issue 52): the bytes they hold follow the dtype
(the formulas and the allocated tensors alike), a decode through them stays near the full-precision one, and a row
carries the error that costs beside its time."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.families.hybrid.spec import HybridModel
from attnbench.families.registry import build_model
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import KVCache, decodable, scratch_tensors, tensor_bytes
from attnbench.timing import precision
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.precision import KeptState, keeping
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import tiny_case

QUICK = TimingPolicy(min_samples=5, min_time_s=0.01, max_case_s=0.5, warmup_max_s=0.05, target_ci=0.05, cache="warm")
HYBRID = HybridModel(("mamba2", "mamba2", "mamba2", "sdpa"))


def case(model: str, dtype: str = "float32", n: int = 16, **kept: str) -> Case:
    made = tiny_case(
        "sdpa" if model == "hy" else model, mode="decode", dtype=dtype, seq_len=n, d_model=64, heads=4, layers=2,
        causal=True,
    )  # fmt: skip
    if model == "hy":
        made = replace(made, model="hy", layers=4, definition=HYBRID.definition())
    return replace(made, kept=tuple(sorted(kept.items())))


def allocated(c: Case) -> tuple[int, list[object]]:
    """Bytes of the state ``c``'s model allocates for n + 1 positions, kept as ``c`` asks, and its layer states."""
    torch.manual_seed(0)
    model = build_model(c, "cpu", getattr(torch, c.dtype))
    with torch.inference_mode(), keeping(c.kept_dtype("kv_dtype"), c.kept_dtype("state_dtype")):
        state = decodable(model).init_state(c.batch, c.span)
    return tensor_bytes(state), list(leaves(state))


def leaves(state: object) -> Iterator[object]:
    for part in getattr(state, "layers", None) or [getattr(state, "body", state)]:
        if part is state or (not hasattr(part, "layers") and not hasattr(part, "body")):
            yield part
        else:
            yield from leaves(part)


@pytest.mark.parametrize("kv", ["int8", "float8_e4m3fn", "float8_e5m2"])
def test_an_8_bit_kv_cache_holds_half_a_bf16_ones_bytes_per_token(kv: str) -> None:
    def per_token(**kept: str) -> int:
        return (state_bytes(case("sdpa-flash", "bfloat16", 33, **kept)) or 0) - (
            state_bytes(case("sdpa-flash", "bfloat16", 32, **kept)) or 0
        )

    assert per_token(kv_dtype=kv) * 2 == per_token()
    held, layers = allocated(case("sdpa-flash", "bfloat16", 32, kv_dtype=kv))
    assert held == state_bytes(case("sdpa-flash", "bfloat16", 32, kv_dtype=kv))  # int8's scales included
    assert all(isinstance(layer, KVCache) and layer.storage.dtype == getattr(torch, kv) for layer in layers)


@pytest.mark.parametrize("model", ["lstm", "gru", "mingru", "mamba2", "gated-deltanet", "rwkv7", "linear-attn", "kda"])
def test_a_recurrent_state_in_bfloat16_holds_half_its_float32_bytes(model: str) -> None:
    full, kept = case(model), case(model, state_dtype="bfloat16")
    assert state_bytes(kept) is not None and 2 * (state_bytes(kept) or 0) == state_bytes(full)
    held, layers = allocated(kept)
    assert held == state_bytes(kept) and allocated(full)[0] == state_bytes(full)
    assert all(isinstance(layer, KeptState) for layer in layers)  # every layer's state is stored narrow
    assert all(t.dtype == torch.bfloat16 for layer in layers for t in layer.tensors())  # type: ignore[attr-defined]


def test_a_hybrid_keeps_its_caches_and_its_states_each_in_their_own_dtype() -> None:
    kept = case("hy", kv_dtype="int8", state_dtype="bfloat16")
    held, layers = allocated(kept)
    assert held == state_bytes(kept)
    assert sum(isinstance(layer, KVCache) for layer in layers) == 1
    assert sum(isinstance(layer, KeptState) for layer in layers) == 3


@pytest.mark.parametrize(
    ("model", "kept", "bound"),
    [
        ("sdpa-flash", {"kv_dtype": "bfloat16"}, 0.01),
        ("sdpa-flash", {"kv_dtype": "int8"}, 0.05),
        ("sdpa-flash", {"kv_dtype": "float8_e4m3fn"}, 0.05),
        ("lstm", {"state_dtype": "bfloat16"}, 0.01),
        ("mamba2", {"state_dtype": "float16"}, 0.01),
        ("mamba2-bf16", {"state_dtype": "bfloat16"}, 0.05),  # its conv window is bf16 already: kept as it is
        ("hy", {"kv_dtype": "int8", "state_dtype": "bfloat16"}, 0.05),
    ],
)
def test_a_kept_decode_stays_near_the_full_precision_one(model: str, kept: dict[str, str], bound: float) -> None:
    c = case(model.removesuffix("-bf16"), "bfloat16" if model.endswith("-bf16") else "float32", **kept)
    errors = precision.kept_error(c, torch.device("cpu"), seed=0)
    assert 0 < errors["kept_error_mean"] <= errors["kept_error_max"] < bound  # rounded, and only a little


def test_a_decode_row_carries_its_error_beside_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = precision.kept_error

    def spy(c: Case, device: torch.device, seed: int) -> dict[str, float]:
        calls.append(c)
        return real(c, device, seed)

    monkeypatch.setattr("attnbench.timing.torch_executor.kept_error", spy)
    executor = TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off"))
    kept = executor.run(case("sdpa-flash", kv_dtype="bfloat16"))
    assert kept.status == "ok", kept.reason
    assert 0 < kept.extra["kept_error_max"] < 0.01 and kept.extra["kept_error_mean"] <= kept.extra["kept_error_max"]
    assert kept.extra["state_bytes"] * 2 == state_bytes(case("sdpa-flash"))
    assert len(calls) == 1 and precision.DECODE_TOKENS >= 256
    plain = executor.run(case("sdpa-flash"))
    assert plain.status == "ok" and "kept_error_max" not in plain.extra and len(calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "mode", "serving"),
    [
        ("sdpa-flash", "prefill", (("prefill_chunk", 8),)),
        ("sdpa-flash", "verify", (("accept", 1), ("draft", 3))),
        ("mamba2", "prefill", (("prefill_chunk", 8),)),
        ("mamba2", "verify", (("accept", 1), ("draft", 3))),
        ("lstm", "verify", (("accept", 2), ("draft", 3))),
    ],
)
def test_the_serving_questions_keep_their_state_as_asked(
    model: str, mode: str, serving: tuple[tuple[str, int], ...]
) -> None:
    kept = {"kv_dtype": "int8"} if model == "sdpa-flash" else {"state_dtype": "bfloat16"}
    executor = TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off"))
    result = executor.run(replace(case(model, **kept), mode=mode, serving=serving))  # type: ignore[arg-type]
    assert result.status in ("ok", "too_slow_for_budget"), result.reason
    if result.ok:
        assert result.extra["kept_error_max"] < 0.05


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        ("mamba2", None),
        ("mamba2", "bfloat16"),
        ("gated-deltanet", None),
        ("lstm", None),
        ("lstm", "float16"),
        ("linear-attn", None),
        ("mamba3", None),
        ("mingru", None),
        ("rwkv7", "bfloat16"),
    ],
)
def test_a_state_stepped_in_place_by_tiles_decodes_as_the_plain_one(
    model: str, kept: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capacity row's stepping (``in_place``): every layer's step runs a tile of rows at a time, commits its next
    state at once, and holds no next-state buffers between calls; its decode is the plain state's."""
    c = replace(case(model), batch=7)
    torch.manual_seed(0)
    built = build_model(c, "cpu", torch.float32)
    tokens = torch.randn(7, 5, 64)
    calls: list[int] = []
    real = KeptState.step_with

    def spy(self: KeptState, step: object, x: torch.Tensor) -> torch.Tensor:
        calls.append(self.rows)
        return real(self, step, x)  # type: ignore[arg-type]

    monkeypatch.setattr(KeptState, "step_with", spy)

    def decode(state_dtype: str | None, in_place: bool) -> tuple[torch.Tensor, list[object]]:
        with torch.inference_mode(), keeping(None, state_dtype, in_place=in_place):
            held = decodable(built).init_state(7, 8)
            outputs = []
            for t in range(5):
                outputs.append(decodable(built).step(tokens[:, t : t + 1], held))
                held.advance()
        return torch.cat(outputs, dim=1), list(leaves(held))

    monkeypatch.setattr(precision, "TILE_BYTES", 1)  # a row per tile: 7 tiles, each its own step
    plain, _ = decode(None, False)
    assert not calls
    tiled, layers = decode(kept, True)
    assert all(isinstance(layer, KeptState) for layer in layers)
    assert calls and set(calls) == {1} and len(calls) == 5 * len(layers)  # every step went through the tiles
    assert all(t.numel() == 0 for layer in layers for t in layer.spare)  # type: ignore[attr-defined]
    assert list(scratch_tensors(layers[0])) == []
    if kept is None:
        torch.testing.assert_close(tiled, plain, rtol=1e-4, atol=1e-5)
    else:  # stored narrow: near, not equal
        assert 0 < (tiled - plain).abs().max() < 0.05


def test_a_kept_state_is_never_held_wide_at_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state is made a tile of rows big and stored narrow: the largest wide tensor a kept init allocates is a
    tile's, never the batch's (an engine allocates its cache in its dtype)."""
    c = replace(case("mamba2"), batch=64)
    built = build_model(c, "cpu", torch.float32)
    made: list[torch.Size] = []
    real = torch.zeros

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        out = real(*args, **kwargs)  # type: ignore[call-overload]
        made.append(out.shape) if out.dtype == torch.float32 else None
        return out

    monkeypatch.setattr(precision, "TILE_BYTES", 1)
    monkeypatch.setattr(torch, "zeros", spy)
    with torch.inference_mode(), keeping(None, "bfloat16"):
        held = decodable(built).init_state(64, 8)
    monkeypatch.setattr(torch, "zeros", real)
    assert made and max(shape[0] for shape in made) == 1  # a tile of one row, however many sequences
    assert all(t.shape[0] == 64 and t.dtype == torch.bfloat16 for t in held.tensors() if t.dim() == 4)


@pytest.mark.parametrize(("model", "scope"), [("sdpa", "model"), ("sdpa", "core"), ("mamba2", "model")])
def test_a_kept_init_holds_no_more_than_the_batchs_state_at_once(
    model: str, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keep`` is shown one sequence's state before the batch's is made: that one is gone first, so a capacity try
    never counts a second copy of a cache (at batch 1, a whole one)."""
    live, peak = [0], [0]
    real = torch.zeros

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        made = real(*args, **kwargs)  # type: ignore[call-overload]
        size = made.numel() * made.element_size()
        live[0] += size
        peak[0] = max(peak[0], live[0])
        weakref.finalize(made, lambda: live.__setitem__(0, live[0] - size))
        return made

    c = tiny_case(model, mode="decode", seq_len=16, d_model=64, heads=4, layers=4, causal=True, scope=scope)
    built = build_model(c, "cpu", torch.float32)
    monkeypatch.setattr(torch, "zeros", counted)
    for batch in (1, 3):
        live[0] = peak[0] = 0
        with torch.inference_mode(), keeping(None, None, in_place=True):
            held = decodable(built).init_state(batch, 64)
            assert peak[0] == tensor_bytes(held)  # every byte made is the batch's state, and nothing beside it
        del held
