"""A minimal protobuf encoder for the part of ``onnx.proto`` that nestflex writes.

Why not the ``onnx`` package: it pulls in protobuf and ml_dtypes (~40 MB installed), a fifth of
the device install's budget, only to serialise a few messages. onnxruntime reads the bytes
without it. This module writes the wire format by hand: a handful of field numbers, copied from
``onnx/onnx.proto`` (proto2 syntax) and named below, and four wire types.

Wire format in brief (https://protobuf.dev/programming-guides/encoding/): a message is a
sequence of fields, each a key ``field_number << 3 | wire_type`` (a varint) followed by its
value: a varint (type 0: ints and enums; negative int64 as their 64-bit two's complement, ten
bytes), a length-delimited run (type 2: strings, bytes, nested messages) or four little-endian
bytes (type 5: float). Repeated scalars are written one key per element, the proto2 default
("unpacked"); every parser also accepts that form, packed or not declared.

A message is built as a list of chunks (:class:`Message`) and joined once by :func:`model`, so a
weight's bytes are copied once however deep they sit (tensor in graph in model), and a weight
given as a contiguous numpy array is not copied before that join at all.

Only what the graphs need is here; a field not listed is never written. Readers are tested
against the ``onnx`` package (``onnx.load_from_string``) in the dev install.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

# wire types
_VARINT, _LEN, _FIXED32 = 0, 2, 5

# field numbers, from onnx.proto (onnx 1.x; stable since IR version 3)
# ModelProto
_MODEL_IR_VERSION, _MODEL_PRODUCER_NAME, _MODEL_GRAPH, _MODEL_OPSET_IMPORT = 1, 2, 7, 8
# OperatorSetIdProto
_OPSET_DOMAIN, _OPSET_VERSION = 1, 2
# GraphProto
_GRAPH_NODE, _GRAPH_NAME, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 2, 5, 11, 12
# NodeProto
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
# AttributeProto (``type`` is field 20: it was added after the value fields)
_ATTR_NAME, _ATTR_F, _ATTR_I, _ATTR_S, _ATTR_T, _ATTR_G, _ATTR_FLOATS, _ATTR_INTS, _ATTR_TYPE = 1, 2, 3, 4, 5, 6, 7, 8, 20
# AttributeProto.AttributeType
ATTR_FLOAT, ATTR_INT, ATTR_STRING, ATTR_TENSOR, ATTR_GRAPH, ATTR_FLOATS, ATTR_INTS = 1, 2, 3, 4, 5, 6, 7
# TensorProto
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_RAW_DATA = 1, 2, 8, 9
# ValueInfoProto, TypeProto (its oneof ``value``: tensor_type = 1), TypeProto.Tensor, TensorShapeProto
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TTENSOR_ELEM_TYPE, _TTENSOR_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2

#: numpy dtype -> TensorProto.DataType
DATA_TYPES: dict[np.dtype, int] = {
    np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10, np.dtype(np.float64): 11, np.dtype(np.uint32): 12, np.dtype(np.uint64): 13,
}
FLOAT = DATA_TYPES[np.dtype(np.float32)]
INT64 = DATA_TYPES[np.dtype(np.int64)]


def _varint(value: int) -> bytes:
    if value < 0:  # int64 fields: two's complement in 64 bits (always ten bytes on the wire)
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class Message:
    """One protobuf message under construction: its encoded chunks and their total size."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def _put(self, chunk: bytes | memoryview) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)

    def _key(self, field: int, wire: int) -> None:
        self._put(_varint(field << 3 | wire))

    def varint(self, field: int, value: int) -> Message:
        self._key(field, _VARINT)
        self._put(_varint(int(value)))
        return self

    def float32(self, field: int, value: float) -> Message:
        self._key(field, _FIXED32)
        self._put(struct.pack("<f", value))
        return self

    def blob(self, field: int, data: bytes | memoryview) -> Message:
        """A length-delimited field; ``data`` is kept by reference (a memoryview must be of bytes)."""
        self._key(field, _LEN)
        self._put(_varint(len(data)))
        self._put(data)
        return self

    def text(self, field: int, text: str) -> Message:
        return self.blob(field, text.encode("utf-8"))

    def message(self, field: int, sub: Message) -> Message:
        self._key(field, _LEN)
        self._put(_varint(sub.size))
        self.parts.extend(sub.parts)
        self.size += sub.size
        return self

    def encode(self) -> bytes:
        return b"".join(self.parts)


# --------------------------------------------------------------------------------------------
# ONNX messages


def tensor(name: str, array: np.ndarray) -> Message:
    """A TensorProto holding ``array`` (its dtype one of :data:`DATA_TYPES`) as little-endian raw_data."""
    array = np.asarray(array)
    dtype = array.dtype.newbyteorder("<")  # raw_data is little-endian whatever the host
    data = np.asarray(array, dtype=dtype, order="C")  # not ascontiguousarray: it makes a scalar 1-D
    m = Message()
    for d in data.shape:
        m.varint(_TENSOR_DIMS, d)
    m.varint(_TENSOR_DATA_TYPE, DATA_TYPES[np.dtype(dtype.newbyteorder("="))])
    m.text(_TENSOR_NAME, name)
    return m.blob(_TENSOR_RAW_DATA, memoryview(data).cast("B") if data.size else b"")


def value_info(name: str, elem_type: int, shape: Sequence[int | str] | None) -> Message:
    """A ValueInfoProto of a tensor: each dim a size (``dim_value``) or a symbol (``dim_param``);
    ``shape=None`` leaves the shape out (rank unknown, as a subgraph's outputs may be)."""
    tensor_type = Message().varint(_TTENSOR_ELEM_TYPE, elem_type)
    if shape is not None:
        dims = Message()
        for d in shape:
            dim = Message().text(_DIM_PARAM, d) if isinstance(d, str) else Message().varint(_DIM_VALUE, d)
            dims.message(_SHAPE_DIM, dim)
        tensor_type.message(_TTENSOR_SHAPE, dims)
    return Message().text(_VALUE_NAME, name).message(_VALUE_TYPE, Message().message(_TYPE_TENSOR, tensor_type))


def _attr(name: str, kind: int) -> Message:
    return Message().text(_ATTR_NAME, name).varint(_ATTR_TYPE, kind)


def attr_int(name: str, value: int) -> Message:
    return _attr(name, ATTR_INT).varint(_ATTR_I, value)


def attr_float(name: str, value: float) -> Message:
    return _attr(name, ATTR_FLOAT).float32(_ATTR_F, value)


def attr_string(name: str, value: str) -> Message:
    return _attr(name, ATTR_STRING).text(_ATTR_S, value)


def attr_ints(name: str, values: Iterable[int]) -> Message:
    m = _attr(name, ATTR_INTS)
    for v in values:
        m.varint(_ATTR_INTS, v)
    return m


def attr_floats(name: str, values: Iterable[float]) -> Message:
    m = _attr(name, ATTR_FLOATS)
    for v in values:
        m.float32(_ATTR_FLOATS, v)
    return m


def attr_tensor(name: str, value: Message) -> Message:
    """``value``: a :func:`tensor` message."""
    return _attr(name, ATTR_TENSOR).message(_ATTR_T, value)


def attr_graph(name: str, value: Message) -> Message:
    """``value``: a :func:`graph` message (the branches of ``If``, the body of ``Loop``)."""
    return _attr(name, ATTR_GRAPH).message(_ATTR_G, value)


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str = "",
         attributes: Iterable[Message] = (), domain: str = "") -> Message:
    """A NodeProto; an empty string in ``inputs`` is an omitted optional input (ONNX's convention)."""
    m = Message()
    for i in inputs:
        m.text(_NODE_INPUT, i)
    for o in outputs:
        m.text(_NODE_OUTPUT, o)
    if name:
        m.text(_NODE_NAME, name)
    m.text(_NODE_OP_TYPE, op_type)
    for a in attributes:
        m.message(_NODE_ATTRIBUTE, a)
    if domain:
        m.text(_NODE_DOMAIN, domain)
    return m


def graph(name: str, nodes: Iterable[Message], inputs: Iterable[Message], outputs: Iterable[Message],
          initializers: Iterable[Message] = ()) -> Message:
    """A GraphProto: ``inputs`` and ``outputs`` are :func:`value_info` messages."""
    m = Message()
    for n in nodes:
        m.message(_GRAPH_NODE, n)
    m.text(_GRAPH_NAME, name)
    for t in initializers:
        m.message(_GRAPH_INITIALIZER, t)
    for v in inputs:
        m.message(_GRAPH_INPUT, v)
    for v in outputs:
        m.message(_GRAPH_OUTPUT, v)
    return m


#: the default-domain opset the graphs use (onnxruntime >= 1.13 runs it)
OPSET = 17
#: IR version 8: the one that came with opset 17 (onnx 1.12), read by every onnxruntime that runs opset 17
IR_VERSION = 8


def model(graph_message: Message, producer: str = "nestflex", opset: int = OPSET,
          ir_version: int = IR_VERSION) -> bytes:
    """A serialised ModelProto of ``graph_message`` importing the default domain at ``opset``."""
    m = Message().varint(_MODEL_IR_VERSION, ir_version).text(_MODEL_PRODUCER_NAME, producer)
    m.message(_MODEL_GRAPH, graph_message)
    m.message(_MODEL_OPSET_IMPORT, Message().text(_OPSET_DOMAIN, "").varint(_OPSET_VERSION, opset))
    return m.encode()
