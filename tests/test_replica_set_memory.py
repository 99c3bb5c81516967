"""How many standbys a host can run (``kip98 db start --standbys``) is read from the memory
the kernel can give new processes, the page cache it would drop included."""

from __future__ import annotations

from pathlib import Path

from app.storage.replica_set import available_memory, mem_available

MEMINFO = (
    "MemTotal:       24576000 kB\n"
    "MemFree:          900000 kB\n"
    "MemAvailable:   22000000 kB\n"
    "Buffers:          100000 kB\n"
    "Cached:         20000000 kB\n"
)


def test_the_page_cache_the_kernel_would_drop_counts_as_available() -> None:
    """A host whose memory sits in the page cache after much I/O (under 1 GB free, 22 GB
    available) still runs standbys: MemAvailable is read, not the free pages."""
    assert mem_available(MEMINFO) == 22_000_000 * 1024
    assert mem_available("MemTotal: 1 kB\nMemFree: 1 kB\n") is None


def test_the_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    """The count of standbys that fit uses what ``mem_available`` reads from the file."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO, encoding="ascii")
    assert available_memory(str(meminfo)) == 22_000_000 * 1024
