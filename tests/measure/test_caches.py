"""The CPU's last-level cache from sysfs: what a cold flush must overwrite on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.host.caches import (
    UNKNOWN_FLUSH_BYTES,
    cpu_flush_bytes,
    last_level_cache_bytes,
    parse_cache_size,
)


def sysfs(tmp_path: Path, caches: list[tuple[str, str]]) -> Path:
    for i, (level, size) in enumerate(caches):
        index = tmp_path / f"index{i}"
        index.mkdir()
        (index / "level").write_text(level + "\n")
        (index / "size").write_text(size + "\n")
    return tmp_path


def test_the_highest_level_is_the_last_level_cache(tmp_path: Path) -> None:
    folder = sysfs(tmp_path, [("1", "48K"), ("1", "32K"), ("2", "1024K"), ("3", "32768K")])
    assert last_level_cache_bytes(folder) == 32 * 2**20
    assert cpu_flush_bytes(last_level_cache_bytes(folder)) == 64 * 2**20  # twice it


def test_without_sysfs_the_flush_writes_a_fixed_amount(tmp_path: Path) -> None:
    assert last_level_cache_bytes(tmp_path / "none") is None
    assert cpu_flush_bytes(None) == UNKNOWN_FLUSH_BYTES


@pytest.mark.parametrize(("text", "size"), [("32768K", 32 * 2**20), ("1M", 2**20), ("512", 512), ("huge", None)])
def test_sysfs_sizes_read_as_bytes(text: str, size: int | None) -> None:
    assert parse_cache_size(text) == size
