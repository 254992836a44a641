"""The safetensors header of a bundle's weights, read and checked without torch (or the safetensors
package): :func:`read_safetensors_header`.
"""

from __future__ import annotations

from typing import Any

from nestflex.deploy.bundle._reading import _show
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.strict_json import parse_json

__all__ = [
    "read_safetensors_header",
    "MAX_HEADER_BYTES",
]

#: the largest safetensors header :func:`read_safetensors_header` reads (a VGG-16 bundle's is ~10 KB);
#: read at call time, so a program may raise it before :func:`nestflex.deploy.load`
MAX_HEADER_BYTES = 16 * 2**20
_WEIGHTS_HINT = "the weights are corrupt; export the bundle again"


def read_safetensors_header(path: Any) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data_offsets), torch-free.

    The header is parsed by :func:`parse_json` (depth, size, number limits; no NaN/Infinity) and
    its layout checked as the safetensors reader will check it when the runtime opens the file
    (:func:`_layout_problem`), so a file that passes here does not fail later with a ``SafetensorError``.

    Raises:
        BundleError: the file is not a safetensors file (or cannot be read); ``problems`` holds
            the one reason, without the path.
    """
    def refuse(problem: str) -> BundleError:
        return BundleError(f"{str(path)!r} is not a safetensors file ({problem}). HINT: {_WEIGHTS_HINT}", [problem])

    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            size = f.seek(0, 2)
            if n <= 0 or n > size - 8:
                raise refuse(f"header length {n} does not fit a {size}-byte file")
            if n > MAX_HEADER_BYTES:  # read whole before parsing: bound it (safetensors itself caps at 100 MB)
                raise refuse(f"header of {n} bytes is above the {MAX_HEADER_BYTES}-byte limit")
            f.seek(8)
            data = f.read(n)
    except OSError as e:
        raise refuse(f"cannot be read: {e.strerror or e}") from None
    try:
        header = parse_json(data, "its header", _WEIGHTS_HINT)
    except BundleError as e:
        raise refuse(str(e).split(". HINT: ")[0]) from None
    problem = _layout_problem(header, size - 8 - n)
    if problem is not None:
        raise refuse(problem)
    return header


#: bytes per element of the safetensors dtypes a bundle may hold (others are refused by the schema)
_SAFETENSORS_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                         "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E5M2": 1, "F8_E4M3": 1}


def _layout_problem(header: Any, data_bytes: int) -> str | None:
    """Why ``header`` does not describe ``data_bytes`` of tensor data as safetensors requires, or ``None``.

    The rules of the safetensors reader: every entry has a known dtype, a shape of non-negative
    ints and ``data_offsets`` ``[begin, end]`` holding exactly its elements; the entries tile the
    data from 0 to its end without gaps or overlaps; ``__metadata__`` maps strings to strings.
    """
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return "`__metadata__` is not an object of strings"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shown = name if len(name) <= 80 else name[:77] + "..."
        if not isinstance(entry, dict):
            return f"tensor {shown!r} is not described by an object"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _SAFETENSORS_ITEMSIZE:
            return f"tensor {shown!r} has dtype {_show(dtype, 20)}, not one of {', '.join(_SAFETENSORS_ITEMSIZE)}"
        ints = (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in [*shape, *offsets]))
        if not ints:
            return (f"tensor {shown!r} needs a shape and data_offsets of non-negative ints, got {_show(shape, 40)} "
                    f"and {_show(offsets, 40)}")
        numel = 0 if 0 in shape else 1
        for d in shape:  # stop early: the product of a forged shape could have millions of digits
            numel *= d
            if numel > data_bytes:
                break
        if offsets[1] - offsets[0] != numel * _SAFETENSORS_ITEMSIZE[dtype]:
            return (f"tensor {shown!r} is {dtype}{shape} but data_offsets {offsets} span {offsets[1] - offsets[0]} "
                    f"bytes")
        spans.append((offsets[0], offsets[1], shown))
    end = 0
    for begin, stop, shown in sorted(spans):
        if begin != end:
            return f"tensor {shown!r} starts at byte {begin} of the data, expected {end} (a gap or an overlap)"
        end = stop
    if end != data_bytes:
        return f"the tensors cover {end} bytes of data, the file holds {data_bytes}"
    return None
