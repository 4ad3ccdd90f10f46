"""What a device has free, and byte counts in words: for refusing work that cannot fit before it starts."""

from __future__ import annotations

import os

import torch


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: the GPU's free memory, or the machine's available memory for the CPU (Linux's
    ``MemAvailable``, which counts reclaimable caches; else the free pages)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def gigabytes(count: int) -> str:
    """``1.2 GB`` (below 0.1 GB: ``35 MB``; below 1 MB: ``120 kB``)."""
    if count >= 1e8:
        return f"{count / 1e9:.1f} GB"
    return f"{count / 1e6:.0f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"
