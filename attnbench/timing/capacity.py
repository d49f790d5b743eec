"""The largest batch whose decode step fits a memory budget (``mode: capacity``, issue 41).

The budget holds the weights, the state of B sequences at context n (a KV cache of n + 1 positions, or a recurrent
state of one size whatever n) and the working memory of one decode step at batch B. The batch is found from memory
measured, never from a formula, each try allocating the state, making it stand in for n tokens (``fill_to``; a real
prefill where the state cannot) and running one step:

- on a GPU by real allocation: the caching allocator capped at the budget (``set_per_process_memory_fraction``,
  put back afterwards), batches doubled from 1 until one runs out of memory (caught), then bisected between the last
  that ran and the first that did not. ``bytes_per_sequence`` is the peak's growth between the two largest that ran.
- on a CPU, whose allocator has no cap to run into: the peak resident memory of the same work (``RssPeak``) at
  batches 1, 2, then ×8 until one holds an eighth of the budget; the last two give a line (fixed bytes + bytes per
  sequence × B), solved for the budget; then runs at the batch found confirm it: one that does not fit runs a second
  time (a first run at a new batch may also pay for memory a kernel keeps, its workspace), then the batch is lowered
  in proportion and by ``CONFIRM_MARGIN``; one that fits with more than ``CAPACITY_SLACK`` of the budget to spare is
  raised in proportion (the line, fitted where the allocator's fixed costs still weigh, can overstate a sequence's
  bytes); at most ``CONFIRMS`` batches, the largest that fitted kept (where none did, on a noisy machine, the largest
  growth point within the budget, a lower bound the row says it is: ``capacity_unsettled``). ``bytes_per_sequence``
  is the growth from the largest fitted point to the batch found.

A CPU reading is as clean as the allocator lets it be: glibc serves a buffer under its mmap threshold (at most
32 MiB) from a heap whose history (freed, not yet reused) shows in the peak, by up to one such buffer; at budgets
where a step's buffers are larger (a recurrence's gates at a batch of many thousands) each is mapped and unmapped
whole, and the search repeats itself to within a few percent.

The weights count at their tensors' bytes (parameters and buffers), held before any try. A GPU's default budget
(``memory_budget`` 0) is its free memory, plus what this process already holds, less ``margin_bytes``; a CPU has
none (the config must give one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.core.units import format_bytes
from attnbench.families.registry import make_input
from attnbench.families.serving import chunks
from attnbench.families.states import decodable, fill_state, tensor_bytes
from attnbench.families.torch_family import LaunchLimit
from attnbench.host.memory import RssPeak, bounded_allocation
from attnbench.timing.failures import is_oom

# The largest batch a search tries: far beyond a step anyone would time, short of one that would take hours on a CPU.
MAX_CAPACITY = 2**21
CONFIRMS = 4  # runs at the batch found (raised or lowered) before the search settles or gives up
CONFIRM_MARGIN = 0.01  # what a confirmation moves the batch by beyond the proportion it measured, towards fitting
CAPACITY_SLACK = 0.03  # a confirmed batch that uses this much of the budget or more is the one found
_GROWTH = 8  # a CPU search's factor between batches
# The feeding of a real prefill, where a state cannot stand in for n tokens: chunks this long.
_PREFILL_CHUNK = 4096


@dataclass(frozen=True)
class Capacity:
    """What a search found: the batch, the bytes each sequence adds, the budget it was held to and how."""

    batch: int
    bytes_per_sequence: int
    budget_bytes: int
    weight_bytes: int
    method: str  # "rss-fit" (CPU), "cuda-oom-search" (GPU)
    capped: bool = False  # the batch reached the search's ceiling: the budget would hold more
    # What stopped the search: "memory" (the budget), "kernel-grid" (the largest batch its kernels launch,
    # ``LaunchLimit``) or "search" (MAX_CAPACITY).
    capped_by: str = "memory"
    # Bytes the process held at the search's start beyond the weights (the cold flush's buffer, which lives for the
    # worker): outside the budget, so that a GPU's capacity and a CPU's answer the same question.
    excluded_bytes: int = 0
    # Why the search did not settle ("" when it did): no confirmation fitted (a noisy machine's resident memory), so
    # the batch is the largest of its tries that held within the budget, a lower bound.
    unsettled: str = ""


def margin_bytes(total: int) -> int:
    """What a GPU's default budget leaves free: 5 % of the device's memory, at least 1 GiB (the CUDA context, other
    processes' growth, the allocator's fragmentation)."""
    return max(2**30, total // 20)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def stand_in(model: nn.Module, case: Case, batch: int, device: torch.device, dtype: torch.dtype) -> Any:
    """The state of ``batch`` sequences holding n tokens: standing in (``Fillable``), or prefilled for real."""
    decoder = decodable(model)
    state = decoder.init_state(batch, case.seq_len + 1)
    if not fill_state(state, case.seq_len):
        for start, end in chunks(case.seq_len, _PREFILL_CHUNK):
            context = make_input(replace(case, mode="decode", batch=batch, seq_len=end - start), str(device), dtype)
            decoder.prefill(context, state, output=False)
    return state


def one_step(model: nn.Module, case: Case, batch: int, device: torch.device, dtype: torch.dtype) -> int:
    """What a try runs: the state of ``batch`` sequences at n, and one decode step against it; the bytes the state
    and the token hold (what the try's peak is at least)."""
    state = stand_in(model, case, batch, device, dtype)
    token = make_input(replace(case, mode="decode", batch=batch, seq_len=1, serving=()), str(device), dtype)
    decodable(model).step(token, state)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return tensor_bytes(state) + token.numel() * token.element_size()


def find_capacity(
    model: nn.Module,
    case: Case,
    budget: int,
    device: torch.device,
    dtype: torch.dtype,
    rss: RssPeak | None,
    limit: LaunchLimit | None = None,
) -> Capacity:
    """The largest batch whose step fits ``budget`` bytes (0: the device's default), and ``limit`` (the largest its
    kernels launch) at most. MemoryError where not one sequence fits; ValueError where no budget can be measured
    here."""

    def run(batch: int) -> int:
        return one_step(model, case, batch, device, dtype)

    weights = weight_bytes(model)
    ceiling = MAX_CAPACITY if limit is None else max(1, min(MAX_CAPACITY, limit.batch))
    if device.type == "cuda":
        found = _on_gpu(run, budget, weights, device, ceiling)
    else:
        if not budget:
            raise ValueError("mode capacity on a CPU needs memory_budget: a CPU has no free memory to default to")
        if rss is None:
            raise ValueError("mode capacity on a CPU measures peak resident memory, which this process cannot read")
        found = _on_cpu(run, budget, weights, rss, ceiling)
    if found.capped and limit is not None and ceiling == limit.batch:
        return replace(found, capped_by="kernel-grid")  # what its kernels can launch, not memory, bounded the batch
    return found


def search_batches(fits: Callable[[int], bool], ceiling: int) -> int:
    """The largest batch up to ``ceiling`` that ``fits`` (0: not even one): doubled from 1 until one does not fit
    or the next would pass the ceiling, then bisected below the first that did not (or the ceiling). No batch above
    the ceiling is tried: past a kernel's launch limit a try fails for another reason than memory."""
    good, bad = 0, 1
    while bad <= ceiling and fits(bad):
        good, bad = bad, bad * 2
    if not good:
        return 0
    bad = min(bad, ceiling + 1)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good


def gpu_budget(budget: int, *, free: int, reserved: int, allocated: int, weights: int, total: int) -> tuple[int, int]:
    """The budget the search holds the model to (``budget``, or 0: the free memory, plus what this process holds,
    less ``margin_bytes`` and what the sweep keeps) and the bytes outside it: what the process had allocated
    beyond the weights (the cold flush's buffer, ≥ 256 MiB). The allocator's cap is set at their sum, since
    ``set_per_process_memory_fraction`` caps everything the process holds."""
    excluded = max(0, allocated - weights)
    if not budget:
        budget = free + reserved - margin_bytes(total) - excluded
    return budget, excluded


def _none_fits(budget: int, weights: int, one: int | None) -> MemoryError:
    held = f"one sequence's state and step take {format_bytes(one)} more" if one is not None else "one does not fit"
    return MemoryError(
        f"not one sequence fits the memory budget of {format_bytes(budget)}: the weights take "
        f"{format_bytes(weights)} and {held}"
    )


def _on_cpu(
    run: Callable[[int], int], budget: int, weights: int, rss: RssPeak, ceiling: int = MAX_CAPACITY
) -> Capacity:
    room = budget - weights

    def peak(batch: int) -> int:
        """The try's resident growth, and never less than the state it held: pages a long-lived process kept
        resident from earlier work (freed, not handed back) would hide that much from the reading. A try may map
        no more than the budget: one that asks for more does not fit, and is never made."""
        rss.start()
        try:
            with bounded_allocation(budget):
                held = run(batch)
        except Exception as exc:
            if not is_oom(exc):
                raise
            return budget + 1  # over the room whatever the weights take
        return max(rss.peak_bytes(), held)

    points = [(1, peak(1))]
    if room <= 0 or points[0][1] > room:
        raise _none_fits(budget, weights, points[0][1])
    batch = 2
    while batch <= ceiling:
        points.append((batch, peak(batch)))
        if points[-1][1] >= room / _GROWTH:
            break
        batch *= _GROWTH
    (b1, m1), (b2, m2) = points[-2:]
    slope = max(1, math.ceil((m2 - m1) / (b2 - b1)))
    found = max(1, min(ceiling, (room - (m2 - slope * b2)) // slope))
    best, best_held = 0, 0
    for _ in range(CONFIRMS):
        held = peak(found)
        if held > room:  # once more before lowering: a first run at a batch may also pay for a kernel's workspace
            held = min(held, peak(found))
        if held <= room:
            best, best_held = max((best, best_held), (found, held))
            # Within CAPACITY_SLACK of the budget, or at the search's largest: found. Else the line, fitted where
            # the allocator's fixed costs still weigh, overstated a sequence's bytes: step up by what is left.
            if held >= room * (1 - CAPACITY_SLACK) or found >= ceiling:
                break
            step = min(ceiling, int(found * room / held * (1 - CONFIRM_MARGIN)))
        else:
            if found == 1:
                raise _none_fits(budget, weights, held)
            # Lowered in proportion, and by a margin besides: an overshoot is page-rounding and allocator slack that
            # a proportional cut alone would meet again.
            step = max(1, min(found - 1, int(found * room / held * (1 - CONFIRM_MARGIN))))
        if step <= best or step == found:
            break
        found = step
    unsettled = ""
    if not best:
        # A noisy machine (issue 50 §3.7): no confirmation held, though the growth points did. Report what was
        # found — the largest batch a try held within the budget — and say so, rather than fail the row.
        best, best_held = max((b, m) for b, m in points if m <= room)
        unsettled = (
            f"the search did not settle: {found} sequences still took {format_bytes(held)} of the "
            f"{format_bytes(room)} the weights leave after {CONFIRMS} tries; {best} is the largest batch a try held "
            "within the budget (a lower bound)"
        )
    # What one more sequence adds at scale: from the largest growth point to the batch found.
    per_sequence = max(1, (best_held - m2) // (best - b2)) if best > b2 else slope
    return _capped(Capacity(best, per_sequence, budget, weights, "rss-fit", unsettled=unsettled), ceiling)


def _on_gpu(
    run: Callable[[int], int], budget: int, weights: int, device: torch.device, ceiling: int = MAX_CAPACITY
) -> Capacity:
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    free, _ = torch.cuda.mem_get_info(device)
    budget, excluded = gpu_budget(
        budget,
        free=free,
        reserved=torch.cuda.memory_reserved(device),
        allocated=torch.cuda.memory_allocated(device),
        weights=weights,
        total=total,
    )
    if budget + excluded > total:  # a budget the device cannot hold: the search would report the device's memory
        raise ValueError(f"memory_budget {format_bytes(budget)} is more than {device}'s memory ({format_bytes(total)})")
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    before = float(getter(device)) if getter is not None else 1.0
    torch.cuda.set_per_process_memory_fraction(min(1.0, (budget + excluded) / total), device)
    base = torch.cuda.memory_allocated(device)
    peaks: dict[int, int] = {}

    def fits(batch: int) -> bool:
        torch.cuda.reset_peak_memory_stats(device)
        try:
            run(batch)
        except Exception as exc:
            if not is_oom(exc):
                raise
            return False
        finally:
            torch.cuda.empty_cache()
        peaks[batch] = torch.cuda.max_memory_allocated(device) - base
        return True

    try:
        good = search_batches(fits, ceiling)
        if not good:
            raise _none_fits(budget, weights, None)
    finally:
        torch.cuda.set_per_process_memory_fraction(before, device)
        torch.cuda.empty_cache()
    smaller = max((b for b in peaks if b < good), default=None)
    per_sequence = peaks[good] // good if smaller is None else (peaks[good] - peaks[smaller]) // (good - smaller)
    found = Capacity(good, max(per_sequence, 1), budget, weights, "cuda-oom-search", excluded_bytes=excluded)
    return _capped(found, ceiling)


def _capped(found: Capacity, ceiling: int) -> Capacity:
    """``found``, marked capped by the search where it reached the ceiling: the budget would hold more."""
    return replace(found, capped=True, capped_by="search") if found.batch >= ceiling else found
