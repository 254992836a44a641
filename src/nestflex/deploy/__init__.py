"""The light runtime: loads nestflex bundles and runs them under schedulers.

Invariant (DESIGN.md 6): importing this package pulls in no training dependency (Lightning,
timm, torchmetrics, onnx). Here: the bundle loader (:func:`load`, :mod:`nestflex.deploy.bundle`),
the multi-capacity and progressive runtimes (:mod:`nestflex.deploy.runtime`), the CLI
(``nestflex`` / ``python -m nestflex.deploy``), the split-tensor codec
(:mod:`nestflex.deploy.codec`) and the early-exit confidence measures and policy
(:mod:`nestflex.deploy.exits`).
"""

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
from nestflex.deploy.bundle import SCHEMA_VERSION, Bundle, BundleError, load
from nestflex.deploy.exits import (
    ExitError,
    ExitResult,
    apply_policy,
    early_exit,
    get_confidence,
    list_confidences,
    register_confidence,
)
from nestflex.deploy.runtime import CapacityRuntime, PagingReport, ProgressiveRuntime
from nestflex.deploy.engine import Engine, EngineError, FrameResult
from nestflex.deploy.profiler import OnlineProfiler, ProfilerError
from nestflex.deploy.scheduler import (
    AppProfile,
    Decision,
    SchedulerError,
    get_scheduler,
    knee_level,
    list_schedulers,
    register_scheduler,
)
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
    # simulation is a benchmark, not runtime: benchmarks/multitenant.py
    "SchedulerError",
    "AppProfile",
    "Decision",
    "knee_level",
    "register_scheduler",
    "list_schedulers",
    "get_scheduler",
]
