"""Reading one tensor from a .safetensors file.

The format is small and fixed: an 8-byte little-endian header length, a JSON header mapping each
key to {dtype, shape, data_offsets: [begin, end]} (offsets into the byte buffer that follows), then
the buffer. Reading it here avoids a dependency for one function, and lets the loader check a
workload's shapes and dtypes from the header alone, before any worker starts.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

# safetensors dtype tag -> definition dtype name
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
MAX_HEADER_BYTES = 100 * 2**20


class SafetensorsError(ValueError):
    pass


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def read_header(path: Path) -> tuple[dict, int]:
    """The header (key -> entry, without __metadata__) and the byte offset where the buffer starts.
    Errors never quote the file's bytes: the file may not be a safetensors file at all."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise SafetensorsError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw_len)
            if n > MAX_HEADER_BYTES:
                raise SafetensorsError("the header length field is implausible (not a safetensors file?)")
            raw = f.read(n)
        if len(raw) != n:
            raise SafetensorsError("file shorter than its header length field says (not a safetensors file?)")
        header = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except OSError as exc:
        raise SafetensorsError(f"unreadable ({exc.strerror or type(exc).__name__})") from None
    except (ValueError, RecursionError):
        raise SafetensorsError("the header is not UTF-8 JSON (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise SafetensorsError("the header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + n


def _is_size(x) -> bool:
    return type(x) is int and 0 <= x < 2**63


def describe(path: Path | str, key: str) -> tuple[str, tuple[int, ...]]:
    """(dtype name, shape) of `key`, checked against its byte range and the file's actual length."""
    path = Path(path)  # a workload's record crosses to the worker as JSON: a str
    header, start = read_header(path)
    if key not in header:
        raise SafetensorsError(f"no tensor {key!r}; keys: {', '.join(sorted(map(str, header))) or '(none)'}")
    entry = header[key]
    if not isinstance(entry, dict):
        raise SafetensorsError(f"tensor {key!r}: its header entry is not an object")
    tag = entry.get("dtype")
    if not isinstance(tag, str) or tag not in DTYPES:
        raise SafetensorsError(
            f"tensor {key!r} has dtype {tag!r}, which mini_kv does not read (known: {', '.join(DTYPES)})"
        )
    dtype = DTYPES[tag]
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
        raise SafetensorsError(f"tensor {key!r}: shape {shape!r} is not a list of non-negative integers")
    offsets = entry.get("data_offsets")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_size(o) for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise SafetensorsError(
            f"tensor {key!r}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end"
        )
    begin, end = offsets
    if end - begin != math.prod(shape) * ITEMSIZE[dtype]:
        raise SafetensorsError(
            f"tensor {key!r}: byte range {begin}..{end} does not hold {list(shape)} {dtype}"
        )
    size = path.stat().st_size
    if start + end > size:
        raise SafetensorsError(
            f"tensor {key!r}: the file is truncated (its data ends at byte {start + end}, "
            f"the file has {size} bytes)"
        )
    return dtype, tuple(shape)


def load_tensor(path: Path, key: str):
    """The tensor `key` as a CPU torch.Tensor of its own (not a view of the file)."""
    import torch

    dtype, shape = describe(path, key)
    header, start = read_header(path)
    begin, end = header[key]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        data = bytearray(f.read(end - begin))
    if len(data) != end - begin:
        raise SafetensorsError(f"tensor {key!r}: file truncated")
    if not data:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return torch.frombuffer(data, dtype=getattr(torch, dtype)).reshape(shape).clone()
