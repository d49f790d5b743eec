"""Shared prefixes (mode prefix, issue 52 item 3) at the families' level: M requests whose prompts begin with the same
P tokens, prefilled with the prefix shared (a cache of positions read by reference, a recurrent state restored from
a checkpoint) give every request the first token an independent prefill of its whole prompt gives, and hold what
the family's formula says."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import attnbench.families.serving as serving_module
from attnbench.core.cases import Case
from attnbench.families.hybrid.spec import HybridModel
from attnbench.families.registry import build_model, make_input
from attnbench.families.serving import SharedPrefill, prefix_reused, run_tiny, tiny_serving
from attnbench.families.states import SharedPrefix
from attnbench.timing.precision import keeping
from attnbench.timing.serving import _prefix_formulas
from tests.support import tiny_case

# Every built-in family that decodes on a CPU, and a hybrid of a recurrence and attention.
DECODERS = [
    "lstm",
    "gru",
    "mingru",
    "minlstm",
    "linear-attn",
    "mamba2",
    "mamba3",
    "gated-deltanet",
    "deltanet",
    "kda",
    "rwkv7",
    "vanilla",
    "sdpa",
    "sdpa-math",
    "sdpa-flash",
    "mla",
    "hybrid",
]
ATTENTION = {"vanilla", "sdpa", "sdpa-math", "sdpa-flash", "mla"}
P, N, M = 16, 20, 3


def prefix_case(model: str, *, checkpoint_every: int, n: int = N, p: int = P, m: int = M, **kw: object) -> Case:
    name = "sdpa-flash" if model == "hybrid" else model
    case = tiny_case(name, seq_len=n, d_model=32, heads=2, causal=True, **kw)  # type: ignore[arg-type]
    if model == "hybrid":
        case = replace(
            case, model="mamba2-sdpa", definition=HybridModel(("mamba2", "sdpa-flash")).definition(), layers=2
        )
    serving = (("checkpoint_every", checkpoint_every), ("prefix_tokens", p), ("requests", m))
    return replace(case, mode="prefix", batch=1, serving=serving)


def prompts(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared prefix (1, P[, d]) and M prompts that begin with it and differ after it (M, n[, d])."""
    p, m = case.param("prefix_tokens"), case.param("requests")
    alone = replace(case, mode="prefill", serving=(), batch=1, seq_len=p)
    head = make_input(alone, "cpu", torch.float32)
    tails = make_input(replace(alone, batch=m, seq_len=case.seq_len - p), "cpu", torch.float32)
    return head, torch.cat([head.expand(m, *head.shape[1:]), tails], dim=1)


def first_tokens(case: Case) -> tuple[SharedPrefill, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float32).eval()
    head, whole = prompts(case)
    with torch.inference_mode():
        run = SharedPrefill(model, case, head, whole)
        shared = run.shared()[:, -1]
        run.reset()
        return run, shared, run.independent()[:, -1]


@pytest.mark.parametrize("model", DECODERS)
@pytest.mark.parametrize("every", [0, 4])
def test_every_request_gets_the_first_token_an_independent_prefill_gives(
    model: str, every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    restore, joined = serving_module.restore, SharedPrefix.joined
    monkeypatch.setattr(serving_module, "restore", lambda *a: (calls.append("restore"), restore(*a))[1])
    monkeypatch.setattr(SharedPrefix, "joined", lambda self, *a: (calls.append("joined"), joined(self, *a))[1])
    case = prefix_case(model, checkpoint_every=every)
    run, shared, independent = first_tokens(case)
    assert shared.shape == independent.shape == (M, 32)
    torch.testing.assert_close(shared, independent, rtol=1e-4, atol=1e-5)
    # The shortcut ran: attention reused the whole prefix (contiguous: any position) and read it by reference; a
    # recurrence restored the last checkpoint at a multiple of checkpoint_every (none taken: nothing reused).
    reused = P if model in ATTENTION else (P // every * every if every else 0)
    assert run.reused == prefix_reused(case) == reused
    assert ("restore" in calls) == bool(reused)
    assert ("joined" in calls) == (bool(reused) and model in ATTENTION | {"hybrid"})
    recurrent = model not in ATTENTION
    assert len(run.checkpoints) == (P // every if every and recurrent else 0)
    # Each strategy's held bytes, measured, are what the family's formula gives.
    shared_bytes, independent_bytes = run.held_bytes()
    formulas = _prefix_formulas(case, run.reused, len(run.checkpoints))
    assert formulas == {"prefix_bytes_formula": shared_bytes, "independent_bytes_formula": independent_bytes}


def test_a_request_after_a_different_prefix_gets_a_different_first_token() -> None:
    """The check has teeth: restoring another prefix's state changes the answer."""
    case = prefix_case("mamba2", checkpoint_every=4)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float32).eval()
    head, whole = prompts(case)
    with torch.inference_mode():
        right = SharedPrefill(model, case, head, whole).shared()[:, -1]
        wrong = SharedPrefill(model, case, torch.randn_like(head), whole).shared()[:, -1]
    assert float((right - wrong).abs().max()) > 1e-3


@pytest.mark.parametrize(("page", "p"), [(0, 64), (16, 128)])
def test_attention_holds_less_than_twice_one_requests_cache_for_eight_sharing_a_prefix(page: int, p: int) -> None:
    case = prefix_case("sdpa-flash", checkpoint_every=0, n=p + 1, p=p, m=8)
    case = replace(case, kept=(("page_tokens", str(page)),) if page else ())
    with keeping(None, None, page, 0):
        run, shared, independent = first_tokens(case)
    torch.testing.assert_close(shared, independent, rtol=1e-4, atol=1e-5)
    shared_bytes, independent_bytes = run.held_bytes()
    one_request = independent_bytes / 8
    assert shared_bytes < 2 * one_request
    assert _prefix_formulas(case, run.reused, 0)["prefix_bytes_formula"] == shared_bytes


def test_pages_share_whole_pages_only_and_a_hybrid_where_all_its_members_can() -> None:
    paged = replace(prefix_case("sdpa-flash", checkpoint_every=0, n=40, p=30), kept=(("page_tokens", "8"),))
    assert prefix_reused(paged) == 24  # vLLM caches full blocks: the prefix's last partial page is computed again
    hybrid = replace(prefix_case("hybrid", checkpoint_every=12, n=40, p=30), kept=(("page_tokens", "8"),))
    assert prefix_reused(hybrid) == 24  # a multiple of the page (8) and of the checkpoints (12)
    assert prefix_reused(prefix_case("hybrid", checkpoint_every=0, n=40, p=30)) == 0  # its recurrence recomputes


def test_the_probe_asks_the_question_at_its_own_small_size() -> None:
    case = tiny_serving(replace(prefix_case("lstm", checkpoint_every=8, n=10, p=6, m=5), batch=1))
    assert dict(case.serving) == {"prefix_tokens": 5, "requests": 2, "checkpoint_every": 2}
    model = build_model(case, "cpu", torch.float32).eval()
    with torch.inference_mode():
        assert run_tiny(case, model, make_input(case, "cpu", torch.float32)) is None


def test_a_hybrid_in_aligned_pages_restores_at_a_multiple_of_its_page_and_checkpoints_a_page_each() -> None:
    """vLLM's aligned layout (``hybrid_pages: aligned``): the attention page grown to hold the Mamba-2 state (80
    positions at d_model 64), so a prefix is reused only in whole pages that are also checkpoints, and a checkpoint
    takes a page as every state there does (measured = the formula's)."""
    from attnbench.families.catalogue import family_of

    case = prefix_case("hybrid", checkpoint_every=16, n=110, p=100, m=2)
    case = replace(case, d_model=64, heads=4, kept=(("hybrid_pages", "aligned"), ("page_tokens", "16")))
    layout = family_of(case).page_layout(case)
    assert layout[0] == 80 and prefix_reused(case) == 80  # in separate pools of 16-position pages: 96
    with keeping(None, None, *layout):
        run, shared, independent = first_tokens(case)
    torch.testing.assert_close(shared, independent, rtol=1e-4, atol=1e-5)
    assert len(run.checkpoints) == 5
    separate = replace(case, kept=(("page_tokens", "16"),))
    assert prefix_reused(separate) == 96
    shared_bytes, independent_bytes = run.held_bytes()
    formulas = _prefix_formulas(case, run.reused, len(run.checkpoints))
    assert formulas == {"prefix_bytes_formula": shared_bytes, "independent_bytes_formula": independent_bytes}
