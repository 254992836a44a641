"""numpy in, numpy out; torch in, torch out: the runtime's one rule for array types.

The device side computes on numpy (and onnxruntime, which takes and returns numpy), so the base
install needs no torch. The training side and users who already hold torch tensors pass them
unchanged and get torch tensors back: a tensor can only reach us if the caller imported torch,
so converting back never imports it for anyone else. CPU tensors share memory with their numpy
view (``Tensor.numpy()`` / ``torch.from_numpy``), so the conversion copies nothing; a tensor that
needs a gradient or lives on another device is detached and copied to the CPU first (and a
bfloat16 one, which numpy cannot hold, widened to float32), and what comes back goes to the device
of the tensor that came in.

Examples:
    >>> import numpy as np
    >>> x, back = as_numpy([1.0, 2.0])
    >>> type(back(x * 2)).__name__
    'ndarray'
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

__all__ = ["is_torch", "as_numpy", "to_numpy", "like"]


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, decided without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array (a CPU tensor's own memory, no copy; anything else through ``np.asarray``)."""
    if is_torch(x):
        x = x.detach().cpu()
        return (x.float() if x.dtype is sys.modules["torch"].bfloat16 else x).numpy()
    return np.asarray(x)


def like(x: Any, out: Any) -> Any:
    """``out`` (a numpy array, or a tuple/list of them) in ``x``'s array type.

    Torch, on ``x``'s device, when ``x`` is a tensor; ``out`` itself otherwise.
    """
    if not is_torch(x):
        return out
    import torch  # already imported: x is one of its tensors

    def conv(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            a = a if a.flags.c_contiguous else np.ascontiguousarray(a)  # which would make a 0-d array 1-d
            t = torch.from_numpy(a if a.flags.writeable else a.copy())  # torch warns on read-only memory
            return t if x.device.type == "cpu" else t.to(x.device)
        if isinstance(a, (tuple, list)):
            return type(a)(conv(b) for b in a)
        return a

    return conv(out)


def as_numpy(x: Any) -> tuple[np.ndarray, Callable[[Any], Any]]:
    """``(numpy view of x, back)`` where ``back(out)`` returns ``out`` in ``x``'s array type."""
    return to_numpy(x), (lambda out: like(x, out))
