"""Tensors on the wire: a map {dtype, shape, data} with the raw bytes in `data`, never pickled."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError, field, require_map

# torch dtype <-> wire name. Only what a hidden state can be; bfloat16 has no numpy twin,
# so tensors go through their raw bytes (`view(torch.uint8)`) rather than numpy.
WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Dtypes numpy has: their tensors are (de)serialized through numpy, which costs a third of the
# torch calls on a small hidden state (a decode step's), where per-call overhead is all there is.
NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16}


def encode_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    if tensor.dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {tensor.dtype} cannot go on the wire")
    flat = tensor.detach().to("cpu").contiguous()
    if not flat.numel():
        data = b""
    elif flat.dtype in NUMPY_DTYPES:
        data = flat.numpy().tobytes()
    else:
        data = flat.view(torch.uint8).numpy().tobytes()
    return {"dtype": DTYPE_NAMES[flat.dtype], "shape": list(flat.shape), "data": data}


def decode_tensor(obj: Any) -> torch.Tensor:
    fields = require_map(obj, "tensor")
    dtype_name = field(fields, "dtype", str)
    shape = field(fields, "shape", list)
    data = field(fields, "data", bytes)
    if dtype_name not in WIRE_DTYPES:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"dtype {dtype_name!r} is not one of {sorted(WIRE_DTYPES)}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) or len(shape) > 8:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"shape {shape!r} is not a list of non-negative ints")
    dtype = WIRE_DTYPES[dtype_name]
    expected = math.prod(shape) * _ELEMENT_BYTES[dtype_name]
    if expected != len(data):
        raise ProtocolError(
            ErrorCode.BAD_TENSOR, f"shape {shape} of {dtype_name} needs {expected} bytes, got {len(data)}"
        )
    if not data:
        return torch.empty(shape, dtype=dtype)
    if dtype in NUMPY_DTYPES:  # a writable copy: the bytes object is read-only
        return torch.from_numpy(np.frombuffer(data, dtype=NUMPY_DTYPES[dtype]).reshape(shape).copy())
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def hash_tensor(tensor: torch.Tensor, digest):
    """Feeds a tensor's dtype, shape and bytes to `digest` (a hashlib object) and returns it:
    what reports (sha256) and step commitments (8-byte BLAKE2b) name a tensor by."""
    flat = tensor.detach().to("cpu").contiguous()
    digest.update(f"{flat.dtype}{tuple(flat.shape)}".encode())
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest


def all_finite(hidden: torch.Tensor) -> bool:
    """Whether a tensor from the network holds no NaN or inf."""
    # numpy's check costs a fraction of torch's on a decode step's few thousand values
    if hidden.dtype in NUMPY_DTYPES:
        return bool(np.isfinite(hidden.numpy()).all())
    return bool(torch.isfinite(hidden).all())
