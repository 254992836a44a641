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
from nestflex.deploy.bundle.constants import SCHEMA_VERSION
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.loader import Bundle, load
from nestflex.deploy.exits import (
    ExitError,
    ExitResult,
    apply_policy,
    early_exit,
    get_confidence,
    list_confidences,
    register_confidence,
)
from nestflex.deploy.runtime.capacity import CapacityRuntime, PagingReport
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
from nestflex.deploy.engine import Engine, EngineError, FrameResult
from nestflex.deploy.split.network import NetworkProfiler
from nestflex.deploy.profiler import OnlineProfiler, ProfilerError
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs
from nestflex.deploy.split.client import SplitError, TailClient
from nestflex.deploy.split.offload import Offloader, SplitAnswer, SplitConfig
from nestflex.deploy.scheduler.split import SplitCosts, SplitPlan, SplitScheduler
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
