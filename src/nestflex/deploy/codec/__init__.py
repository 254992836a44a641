"""Split-tensor codec: ISQuant, dense packing, compression and the frame that crosses a split.

The pieces, in the order a tensor meets them (METHODS §3-§4):

* :mod:`.isquant` - per-sample linear quantisation to 1..16 bits (DynO ISQuant);
* :mod:`.packing` - dense bit packing of the codes;
* :mod:`.codecs` - byte compressors (bit shuffle + LZ4 by default) behind a registry;
* :mod:`.frame` - the versioned, checksummed binary frame (``encode``/``decode``);
* :mod:`.payoff` - SPINN's "compress only when it pays" test.

All of it runs on numpy, so the device needs no torch. Following the runtime's array rule
(:mod:`nestflex.deploy._arrays`), numpy arrays in give numpy out and torch tensors in give torch
tensors out (the training side passes tensors unchanged); :func:`decode` starts from bytes and
returns numpy arrays.

Examples:
    >>> import numpy as np
    >>> x = np.maximum(np.random.default_rng(0).standard_normal((8, 16, 32, 32)), 0).astype(np.float32)
    >>> frame = encode([x], bits=4)
    >>> y, = decode(frame)
    >>> y.shape == x.shape and x.size * 4 / len(frame) > 8
    True
"""

from nestflex.deploy.codec.codecs import (
    BloscLZ4Codec,
    Codec,
    LZ4FrameCodec,
    RawCodec,
    ZlibCodec,
    get_codec,
    list_codecs,
    register_codec,
)
from nestflex.deploy.codec.errors import CodecError
from nestflex.deploy.codec.frame import (
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_MAX_TENSORS,
    TensorInfo,
    decode,
    encode,
    inspect_frame,
)
from nestflex.deploy.codec.isquant import (
    QuantizedTensor,
    dequantize,
    fake_quantize,
    fixed_quantize,
    isquant,
)
from nestflex.deploy.codec.packing import pack_codes, packed_size, unpack_codes
from nestflex.deploy.codec.payoff import (
    CodecTiming,
    break_even_bandwidth,
    compression_pays_off,
    measure_codec,
)

__all__ = [
    "CodecError",
    # isquant
    "QuantizedTensor",
    "isquant",
    "dequantize",
    "fake_quantize",
    "fixed_quantize",
    # packing
    "pack_codes",
    "unpack_codes",
    "packed_size",
    # codecs
    "Codec",
    "RawCodec",
    "BloscLZ4Codec",
    "LZ4FrameCodec",
    "ZlibCodec",
    "register_codec",
    "list_codecs",
    "get_codec",
    # frame
    "encode",
    "decode",
    "inspect_frame",
    "TensorInfo",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAX_TENSORS",
    # pay-off
    "compression_pays_off",
    "break_even_bandwidth",
    "measure_codec",
    "CodecTiming",
]
