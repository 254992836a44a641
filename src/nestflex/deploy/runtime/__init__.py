"""Runtimes over a loaded bundle: :mod:`.capacity` (the multi-capacity backbone, one level resident,
switched by paging) and :mod:`.progressive` (batched early exit over an exit set).
"""

from nestflex.deploy.runtime.capacity import CapacityRuntime, PagingReport
from nestflex.deploy.runtime.progressive import ProgressiveRuntime

__all__ = ["CapacityRuntime", "PagingReport", "ProgressiveRuntime"]
