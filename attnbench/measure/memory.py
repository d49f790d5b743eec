"""Measured peak host memory of a piece of work: the kernel's resident-set high-water mark (Linux).

Stdlib only. Method ``rss-hwm``: trim the C heap, reset the high-water mark (``echo 5 >
/proc/self/clear_refs``, Linux ≥ 4.0), run the work, and read ``VmHWM`` − the ``VmRSS`` baseline from
``/proc/self/status``. glibc keeps freed memory for reuse, which would hide a later case's allocations inside
an earlier case's pages; ``malloc_trim(0)`` hands every free page of every arena back to the kernel
(``MADV_DONTNEED``), so reusing one faults it in again and counts. We do not change malloc's tuning
(``mallopt``): forcing every block to be mmapped would add page faults to the timed calls and slow the
models that allocate most — a memory method must not change the times. ``tests/test_memory.py`` checks the
method against tensors of known size.

Method ``rss-freed``: the resident bytes a set of tensors gives back when freed — ``resident_bytes()`` (after a
collection and a trim) with them alive, minus the same after they are dropped. A decode row measures the bytes its
KV cache or recurrent state holds so; whatever else the process keeps resident is in both readings and cancels.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from dataclasses import dataclass
from pathlib import Path

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
    freed_method = "rss-freed"

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

    def resident_bytes(self) -> int:
        """``VmRSS`` once garbage is collected and every free page handed back: what live objects hold."""
        gc.collect()
        if self._glibc and self._libc is not None:
            self._libc.malloc_trim(0)
        return _read_status_bytes("VmRSS")
