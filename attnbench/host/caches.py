"""The CPU's last-level cache, read from sysfs (Linux): how much a cold-cache flush must overwrite on a CPU.

``/sys/devices/system/cpu/cpu0/cache/index*/`` holds one folder per cache of the first core, with its ``level`` and
``size`` ("32768K"); the largest level is the last-level cache (an L3 shared by the cores, or an L2 where there is
none). Elsewhere (macOS, a container without sysfs) the size is unknown, and the flush writes a fixed amount.
"""

from __future__ import annotations

import re
from pathlib import Path

from attnbench.core.units import KIB, MIB

CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
# A cold flush overwrites this multiple of the last-level cache (its replacement is not strict LRU: writing exactly
# its size leaves lines behind), or UNKNOWN_FLUSH_BYTES where its size is unknown.
FLUSH_LLC_MULTIPLE = 2
UNKNOWN_FLUSH_BYTES = 256 * MIB
_SIZE = re.compile(r"(\d+)\s*([KMG]?)")
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}


def parse_cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache size ("32768K", "1M", "512"), or None where the text is not one."""
    match = _SIZE.fullmatch(text.strip())
    return None if match is None else int(match.group(1)) * _UNITS[match.group(2)]


def last_level_cache_bytes(caches: Path = CPU_CACHES) -> int | None:
    """The size of the highest-level cache sysfs lists for the first core, or None where it lists none."""
    found: list[tuple[int, int]] = []
    for index in sorted(caches.glob("index*")):
        try:
            level, size = (index / "level").read_text(), parse_cache_size((index / "size").read_text())
        except OSError:
            continue
        if level.strip().isdigit() and size is not None:
            found.append((int(level), size))
    return max(found)[1] if found else None


def cpu_flush_bytes(llc_bytes: int | None) -> int:
    """How much a CPU's cold-cache flush overwrites: ``FLUSH_LLC_MULTIPLE`` × the last-level cache."""
    return FLUSH_LLC_MULTIPLE * llc_bytes if llc_bytes else UNKNOWN_FLUSH_BYTES
