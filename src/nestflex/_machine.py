"""What machine a result was measured on: recorded next to every recipe and benchmark figure."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["machine"]


def machine(**extra: Any) -> dict[str, Any]:
    """CPU model, core count, the platform, numpy's and onnxruntime's versions (with onnxruntime's
    execution providers), and torch's threads, version and GPU when torch is loaded.

    The one machine record of the project: the CLI, the profilers, the recipes and the
    benchmarks all write this next to their timings. It imports no torch: the deploy side runs
    without it, and a process that measured with torch has imported it already, so ``torch``,
    ``torch_threads`` and ``cuda`` are filled exactly when torch did the work (``None`` otherwise).

    Args:
        **extra: more fields for the record (e.g. ``quantized_engine=...``, a ``note``); they
            override the standard ones of the same name.

    Examples:
        >>> record = machine(note="shared machine")
        >>> record["cpus"] >= 1 and record["note"]
        'shared machine'
    """
    import numpy as np

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import onnxruntime as ort

        ort_version, providers = ort.__version__, list(ort.get_available_providers())
    except ImportError:  # the training side can run without it
        ort_version, providers = None, []
    torch = sys.modules.get("torch")  # only when already loaded: never import it for a record
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "onnxruntime": ort_version,
        "onnxruntime_providers": providers,
        "torch": getattr(torch, "__version__", None),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "cuda": torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else None,
        **extra,
    }
