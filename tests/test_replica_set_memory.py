"""How many standbys a host can run (``kip98 db start --standbys``) is read from the memory
the kernel can give new processes, the page cache it would drop included."""

from __future__ import annotations

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


def test_this_hosts_answer_is_its_mem_available() -> None:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        expected = mem_available(meminfo.read())
    assert expected is not None
    found = available_memory()
    assert found is not None
    # Read a moment apart: the same order of magnitude, not the free pages' figure alone.
    assert abs(found - expected) < expected // 10
