"""The light runtime: loads nestflex bundles and runs them under schedulers.

Invariant (DESIGN.md 6): importing this package pulls in no training dependency (Lightning,
timm, torchmetrics, onnx). Here: the bundle loader (:func:`load`, :mod:`nestflex.deploy.bundle`),
the multi-capacity and progressive runtimes (:mod:`nestflex.deploy.runtime`), the CLI
(``nestflex`` / ``python -m nestflex``), the split-tensor codec
(:mod:`nestflex.deploy.codec`), the early-exit confidence measures and policy
(:mod:`nestflex.deploy.exits`), and the device side of split inference (:mod:`nestflex.deploy.split`,
:mod:`~nestflex.deploy.split.client`, :mod:`~nestflex.deploy.split.offload`, :mod:`~nestflex.testing.link`;
gRPC is imported only when a :class:`TailClient` is made).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nestflex._lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers and IDEs; at run time they are imported on first use
    from nestflex.deploy.bundle.constants import SCHEMA_VERSION
    from nestflex.deploy.bundle.errors import BundleError
    from nestflex.deploy.bundle.loader import Bundle, load
    from nestflex.deploy.codec import (
        Codec,
        CodecError,
        QuantizedTensor,
        compression_pays_off,
        decode,
        dequantize,
        encode,
        fake_quantize,
        fixed_quantize,
        get_codec,
        inspect_frame,
        isquant,
        list_codecs,
        register_codec,
    )
    from nestflex.deploy.engine import Engine, EngineError, FrameResult
    from nestflex.deploy.exits import (
        ExitError,
        ExitResult,
        apply_policy,
        early_exit,
        get_confidence,
        list_confidences,
        register_confidence,
    )
    from nestflex.deploy.profiler import OnlineProfiler, ProfilerError
    from nestflex.deploy.runtime.capacity import CapacityRuntime, PagingReport
    from nestflex.deploy.runtime.progressive import ProgressiveRuntime
    from nestflex.deploy.scheduler import (
        AppProfile,
        Decision,
        SchedulerError,
        get_scheduler,
        knee_level,
        list_schedulers,
        register_scheduler,
    )
    from nestflex.deploy.scheduler.split import SplitCosts, SplitPlan, SplitScheduler
    from nestflex.deploy.split.client import SplitError, TailClient
    from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs
    from nestflex.deploy.split.network import NetworkProfiler
    from nestflex.deploy.split.offload import Offloader, SplitAnswer, SplitConfig
    from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime
    from nestflex.errors import NestflexError

__all__ = [
    "NestflexError",
    "CodecError",
    "QuantizedTensor",
    "isquant",
    "dequantize",
    "fake_quantize",
    "fixed_quantize",
    "encode",
    "decode",
    "inspect_frame",
    "Codec",
    "register_codec",
    "list_codecs",
    "get_codec",
    "compression_pays_off",
    # early exits: confidence registry and the exit policy (nestflex.deploy.exits)
    "ExitError",
    "ExitResult",
    "register_confidence",
    "list_confidences",
    "get_confidence",
    "apply_policy",
    "early_exit",
    # bundles: loader and runtimes (nestflex.deploy.bundle, nestflex.deploy.runtime)
    "SCHEMA_VERSION",
    "Bundle",
    "BundleError",
    "load",
    "CapacityRuntime",
    "ProgressiveRuntime",
    "PagingReport",
    # the device engine and its online profiler (nestflex.deploy.engine, nestflex.deploy.profiler)
    "Engine",
    "EngineError",
    "FrameResult",
    "OnlineProfiler",
    "ProfilerError",
    # NestDNN's resource-aware scheduler (nestflex.deploy.scheduler); its multi-tenant
    # simulation is a benchmark, not runtime: benchmarks/engine/multitenant.py
    "SchedulerError",
    "AppProfile",
    "Decision",
    "knee_level",
    "register_scheduler",
    "list_schedulers",
    "get_scheduler",
    # split inference, device side (nestflex.deploy.split, .client, .offload, .scheduler.split);
    # the server is nestflex.serve, the link emulator nestflex.testing.link
    "SERVER_ONLY",
    "SplitRuntime",
    "measure_costs",
    "measure_bytes",
    "accuracy_drops",
    "TailClient",
    "SplitError",
    "Offloader",
    "SplitConfig",
    "SplitAnswer",
    "NetworkProfiler",
    "SplitCosts",
    "SplitPlan",
    "SplitScheduler",
]


#: where each exported name lives. Imported on first use (PEP 562): a device that only loads a bundle and
#: runs its levels does not pay for the engine, split inference or the codec (docs/deploy.md: memory)
_HOME: dict[str, str] = {
    "Codec": "nestflex.deploy.codec",
    "CodecError": "nestflex.deploy.codec",
    "QuantizedTensor": "nestflex.deploy.codec",
    "compression_pays_off": "nestflex.deploy.codec",
    "decode": "nestflex.deploy.codec",
    "dequantize": "nestflex.deploy.codec",
    "encode": "nestflex.deploy.codec",
    "fake_quantize": "nestflex.deploy.codec",
    "fixed_quantize": "nestflex.deploy.codec",
    "get_codec": "nestflex.deploy.codec",
    "inspect_frame": "nestflex.deploy.codec",
    "isquant": "nestflex.deploy.codec",
    "list_codecs": "nestflex.deploy.codec",
    "register_codec": "nestflex.deploy.codec",
    "SCHEMA_VERSION": "nestflex.deploy.bundle.constants",
    "BundleError": "nestflex.deploy.bundle.errors",
    "Bundle": "nestflex.deploy.bundle.loader",
    "load": "nestflex.deploy.bundle.loader",
    "ExitError": "nestflex.deploy.exits",
    "ExitResult": "nestflex.deploy.exits",
    "apply_policy": "nestflex.deploy.exits",
    "early_exit": "nestflex.deploy.exits",
    "get_confidence": "nestflex.deploy.exits",
    "list_confidences": "nestflex.deploy.exits",
    "register_confidence": "nestflex.deploy.exits",
    "CapacityRuntime": "nestflex.deploy.runtime.capacity",
    "PagingReport": "nestflex.deploy.runtime.capacity",
    "ProgressiveRuntime": "nestflex.deploy.runtime.progressive",
    "Engine": "nestflex.deploy.engine",
    "EngineError": "nestflex.deploy.engine",
    "FrameResult": "nestflex.deploy.engine",
    "NetworkProfiler": "nestflex.deploy.split.network",
    "OnlineProfiler": "nestflex.deploy.profiler",
    "ProfilerError": "nestflex.deploy.profiler",
    "SERVER_ONLY": "nestflex.deploy.split.runtime",
    "SplitRuntime": "nestflex.deploy.split.runtime",
    "accuracy_drops": "nestflex.deploy.split.costs",
    "measure_bytes": "nestflex.deploy.split.costs",
    "measure_costs": "nestflex.deploy.split.costs",
    "SplitError": "nestflex.deploy.split.client",
    "TailClient": "nestflex.deploy.split.client",
    "Offloader": "nestflex.deploy.split.offload",
    "SplitAnswer": "nestflex.deploy.split.offload",
    "SplitConfig": "nestflex.deploy.split.offload",
    "SplitCosts": "nestflex.deploy.scheduler.split",
    "SplitPlan": "nestflex.deploy.scheduler.split",
    "SplitScheduler": "nestflex.deploy.scheduler.split",
    "AppProfile": "nestflex.deploy.scheduler",
    "Decision": "nestflex.deploy.scheduler",
    "SchedulerError": "nestflex.deploy.scheduler",
    "get_scheduler": "nestflex.deploy.scheduler",
    "knee_level": "nestflex.deploy.scheduler",
    "list_schedulers": "nestflex.deploy.scheduler",
    "register_scheduler": "nestflex.deploy.scheduler",
    "NestflexError": "nestflex.errors",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
