"""The light runtime: loads nestflex bundles and runs them under schedulers.

Invariant (DESIGN.md 6): importing this package pulls in no training dependency (Lightning,
timm, torchmetrics, onnx). The bundle loader and schedulers land here in later releases;
the split-tensor codec (:mod:`nestflex.deploy.codec`) and the early-exit confidence measures
and policy (:mod:`nestflex.deploy.exits`) are here now.
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
from nestflex.deploy.exits import (
    ExitError,
    ExitResult,
    apply_policy,
    early_exit,
    get_confidence,
    list_confidences,
    register_confidence,
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
]
