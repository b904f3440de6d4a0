"""The build's memory: what the process peaked at, and handing freed heap back to the OS."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident set, MB. VmHWM belongs to the address space, so unlike
    ru_maxrss it does not carry a parent's peak across fork + exec (benchmark workers)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def release_memory() -> None:
    """Collect, then hand the heap's free pages back to the OS. glibc keeps freed memory below the
    top of its heap mapped; after quantization (thousands of block-sized transients) and after
    lowering, that is a gigabyte and more on a 1B model, which would stay in the build's RSS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim this way
        ctypes.CDLL(None).malloc_trim(0)


def available_memory_bytes() -> int | None:
    """What the kernel says can be allocated without swapping (MemAvailable), or None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
