"""What machine a result was measured on: recorded next to every recipe and benchmark figure."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

__all__ = ["machine"]


def machine(**extra: Any) -> dict[str, Any]:
    """CPU model, core count, torch threads and versions, the platform and the GPU name (or ``None``).

    The one machine record of the project: the CLI, the profilers, the recipes and the
    benchmarks all write this next to their timings.

    Args:
        **extra: more fields for the record (e.g. ``quantized_engine=...``, a ``note``); they
            override the standard ones of the same name.

    Example:
        >>> record = machine(note="shared machine")
        >>> record["cpus"] >= 1 and record["note"]
        'shared machine'
    """
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **extra,
    }
