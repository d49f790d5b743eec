"""Measured peak host memory of a piece of work: the kernel's resident-set high-water mark (Linux).

Stdlib only. Method ``rss-hwm``: trim the C heap, reset the high-water mark (``echo 5 >
/proc/self/clear_refs``, Linux ≥ 4.0), run the work, and read ``VmHWM`` − the ``VmRSS`` baseline from
``/proc/self/status``. glibc keeps freed memory for reuse, which would hide a later case's allocations inside
an earlier case's pages; ``malloc_trim(0)`` hands every free page of every arena back to the kernel
(``MADV_DONTNEED``), so reusing one faults it in again and counts. We do not change malloc's tuning
(``mallopt``): forcing every block to be mmapped would add page faults to the timed calls and slow the
models that allocate most — a memory method must not change the times. ``tests/test_memory.py`` checks the
method against tensors of known size.

Method ``resident-pages`` (``ResidentPages``): how many bytes of the pages that back given memory are resident,
by ``mincore(2)`` — RSS's own accounting, restricted to that memory. A decode row measures its KV cache or
recurrent state so: whatever else the process holds (allocator caches, freed-but-kept pages, a long-lived
process's heap layout) cannot leak into the reading, and a state smaller than a page reads the one page it sits
in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from attnbench.core.cases import Case

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass(frozen=True)
class HostMemoryProbe:
    """Whether this process can measure its own peak RSS, and why not if it cannot."""

    available: bool
    reason: str = ""


def _read_status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise OSError(f"{field} missing from {_STATUS}")


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


class RssPeak:
    """Measures the peak RSS growth of the work run between ``start()`` and ``peak_bytes()``."""

    method = "rss-hwm"

    def __init__(self) -> None:
        self._libc = _libc()
        self._glibc = self._libc is not None and hasattr(self._libc, "malloc_trim")
        self._baseline = 0

    @staticmethod
    def probe() -> HostMemoryProbe:
        try:
            _read_status_bytes("VmHWM")
            with _CLEAR_REFS.open("w") as handle:
                handle.write("5")
        except OSError as exc:
            return HostMemoryProbe(False, f"cannot reset the RSS high-water mark ({exc})")
        return HostMemoryProbe(True)

    def start(self) -> None:
        gc.collect()
        if self._glibc and self._libc is not None:
            self._libc.malloc_trim(0)
        with _CLEAR_REFS.open("w") as handle:
            handle.write("5")
        self._baseline = _read_status_bytes("VmRSS")

    def peak_bytes(self) -> int:
        return max(0, _read_status_bytes("VmHWM") - self._baseline)


# mincore's vector holds one byte per page, its lowest bit set when the page is resident (the rest reserved).
_RESIDENT_BIT = bytes(b & 1 for b in range(256))


class ResidentPages:
    """Resident bytes of the pages spanning some memory, each page counted once (``mincore``, Linux)."""

    method = "resident-pages"

    def __init__(self) -> None:
        libc = _libc()
        self._mincore = getattr(libc, "mincore", None) if libc is not None else None
        if self._mincore is not None:
            self._mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
            self._mincore.restype = ctypes.c_int
        self.page = os.sysconf("SC_PAGE_SIZE")

    @property
    def available(self) -> bool:
        return self._mincore is not None

    def bytes_of(self, spans: Iterable[tuple[int, int]]) -> int:
        """Resident bytes of the pages that (address, length) spans touch; a page several spans share counts once."""
        if self._mincore is None:
            raise OSError("mincore is not available in this C library")
        resident, last_page = 0, -1
        for address, length in sorted(spans):
            if length <= 0:
                continue
            first = address // self.page
            pages = (address + length - 1) // self.page - first + 1
            vector = (ctypes.c_ubyte * pages)()
            if self._mincore(first * self.page, pages * self.page, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {pages} pages at {address:#x}")
            skip = min(pages, max(0, last_page - first + 1))  # pages an earlier span already counted
            resident += bytes(vector)[skip:].translate(_RESIDENT_BIT).count(1)
            last_page = max(last_page, first + pages - 1)
        return resident * self.page


def host_memory_bytes() -> int | None:
    """The machine's physical memory in bytes (``sysconf``), or None where the platform does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def check_budget(budget: int | None, device: str, where: str = "", *, total: int | None = None) -> None:
    """Refuse a capacity ``memory_budget`` a CPU cannot hold: more than the machine's memory would be tried (a
    32 GiB state on an 8 GiB machine) and its out-of-memory row would be the budget's doing, not the model's
    (issue 50 §3.4). A GPU's budget is held to the device's memory where the search runs. ``total`` stands in for
    the host's memory (tests)."""
    if not budget or not device.startswith("cpu"):
        return
    from attnbench.core.errors import ConfigError
    from attnbench.core.units import format_bytes

    total = host_memory_bytes() if total is None else total
    if total is not None and budget > total:
        raise ConfigError(
            f"memory_budget {format_bytes(budget)} is more than this machine's memory ({format_bytes(total)}): the "
            "capacity search would try to allocate it",
            where=where,
            key="memory_budget",
            hint=f"give at most the memory the machine can spare, e.g. memory_budget: {format_bytes(total // 2)}",
        )


def check_prefix_states(cases: Iterable[Case], device: str, where: str = "", *, total: int | None = None) -> None:
    """Refuse a mode prefix case whose states a CPU cannot hold (issue 52): its row allocates both strategies' at
    once, at most twice the M independent requests' states at n (the family's formula), so requests × seq_len past
    the machine's memory would be attempted and end the sweep, not make a row. A GPU's states meet the device's
    memory where they are allocated (an oom row). ``total`` stands in for the host's memory (tests)."""
    if not device.startswith("cpu"):
        return
    from attnbench.core.errors import ConfigError
    from attnbench.core.units import format_bytes
    from attnbench.families.state_bytes import state_bytes

    total = host_memory_bytes() if total is None else total
    for case in cases:
        if case.mode != "prefix" or total is None:
            continue
        requests = case.param("requests")
        held = state_bytes(replace(case, mode="prefill", serving=(), batch=requests, seq_len=case.seq_len))
        if held is not None and 2 * held > total:
            raise ConfigError(
                f"requests {requests} at seq_len {case.seq_len} keep {format_bytes(2 * held)} of {case.model}'s states "
                f"(the shared and independent strategies together), more than this machine's memory "
                f"({format_bytes(total)})",
                where=where,
                key="requests",
                hint="give fewer requests or shorter seq_len, or run it on a GPU",
            )


# What a bounded try may allocate beyond its budget: the interpreter's and torch's own working memory for a step.
BOUND_SLACK_BYTES = 256 * 2**20


@contextmanager
def bounded_allocation(budget: int) -> Iterator[None]:
    """While the block runs, this process may map at most ``budget`` (+ ``BOUND_SLACK_BYTES``) more private memory
    than it has now (``RLIMIT_DATA``, which Linux ≥ 4.7 counts private anonymous mappings against): an allocation
    beyond fails at once with an out-of-memory error, rather than being made. A capacity try holds the budget so
    (issue 50 §3.4): a plugin's ``fill_to`` that asks for 50 GB is refused, not attempted. Without the limit on
    this platform the block runs unbounded."""
    try:
        import resource

        held = _read_status_bytes("VmData")
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    except (ImportError, OSError, ValueError):
        yield
        return
    limit = held + budget + BOUND_SLACK_BYTES
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


# glibc's mallopt parameters (mallopt(3)), and where its dynamic thresholds settle once a process has freed a
# 32 MiB block (the mmap threshold's most on 64-bit, and twice that for the trim): a process that has run a model.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_SETTLED_TRIM, _SETTLED_MMAP = 64 * 2**20, 32 * 2**20
# Large enough that no block an op of ``selfcheck`` frees goes back to the kernel (an int: mallopt takes one).
_STEADY = 2**30


@contextmanager
def steady_heap() -> Iterator[bool]:
    """While inside, glibc keeps every freed block in its heap (no ``mmap`` per large block, no trim of the heap's
    top), so an op that allocates and frees the same large buffers each call reuses pages it has touched already.

    By default a freed block of more than 128 KiB… 32 MiB goes back to the kernel when the heap's free top exceeds
    twice the dynamic threshold, and the next call faults its pages in again, zeroed: ``selfcheck``'s written-out
    attention (three 8 MiB score-sized tensors a call at b=2, n=512) took 200–1 700 page faults a call, a number
    that depended on what the timer did between calls, where every other op took none. Yields whether the
    tuning applies (glibc only). On leaving, the thresholds are set where glibc's own dynamic ones settle in a
    process that has run a model (any mallopt of them turns the dynamic adjustment off for good, and its 128 KiB
    start would mmap every large block). A sweep never enters it (see the module's note on ``mallopt``)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None or not hasattr(libc, "malloc_trim"):
        yield False
        return
    mallopt(_M_MMAP_THRESHOLD, _STEADY)
    mallopt(_M_TRIM_THRESHOLD, _STEADY)
    try:
        yield True
    finally:
        mallopt(_M_MMAP_THRESHOLD, _SETTLED_MMAP)
        mallopt(_M_TRIM_THRESHOLD, _SETTLED_TRIM)
