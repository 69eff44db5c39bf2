"""Quantized blocks: `run-peer --quant int8|nf4` stores each block's linear layers in fewer bytes.

Each block is quantized right after its weights load (peer/blocks.py), so a peer's peak memory
is its quantized blocks plus one block in full precision. Norms and biases keep the compute
dtype; the embeddings and the LM head are the client's and stay as they are.

- `int8`: weight-only int8, one scale per output row (symmetric, per channel), run by PyTorch's
  own int8 weight-only matmul (`torch._weight_int8pack_mm`, what torch.compile lowers a
  weight-only int8 linear to). Its vectorized CPU path takes bfloat16 activations, so a float32
  peer runs these layers' matmuls in bfloat16 and casts back. Why not torchao's
  `Int8WeightOnlyConfig`: on CPU in eager mode it dequantizes the whole weight on every call,
  which measured 2.1-3.3x slower than float32 per layer here, while this kernel is faster than
  float32 (docs/operations.md "Quantized peers").
- `nf4`: bitsandbytes' `Linear4bit` (4-bit NormalFloat with double quantization), on CUDA and,
  where its CPU backend works, on CPU.

The same functions quantize a local Hugging Face model (`quantize_model`), so a test or a
benchmark can compare a chain of quantized peers with the same model quantized the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import warnings

import torch
from torch import nn

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS, check_quant

logger = logging.getLogger(__name__)

__all__ = [
    "QUANT_FORMATS",
    "DEFAULT_QUANT",
    "QuantError",
    "check_backend",
    "quantize_layer",
    "quantize_model",
]


class QuantError(ValueError):
    """A weight format this machine cannot run (the message is one line, for the command line)."""


class Int8Linear(nn.Module):
    """`y = x W^T + b` with W stored as int8 and a scale per output row: W ~ q * scale[:, None]."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)  # in the dtype the matmul runs in
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, compute_dtype: torch.dtype) -> Int8Linear:
        weight = linear.weight.detach().float()
        # the scale is rounded to the compute dtype first, so q and the scale the kernel uses agree
        scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(compute_dtype)
        qweight = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(qweight.contiguous(), scales.contiguous(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scales.dtype)
        out = torch._weight_int8pack_mm(flat, self.qweight, self.scales)
        out = out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an int8 layer's matmul runs in: the peer's half-precision dtype, else bfloat16
    (the int8 kernel's vectorized CPU path; its float32 path is many times slower)."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def _bitsandbytes():
    """bitsandbytes, imported without the notes it prints about optional kernels it lacks."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quiet = logging.getLogger("bitsandbytes")
            level, quiet.level = quiet.level, logging.ERROR
            try:
                import bitsandbytes
            finally:
                quiet.setLevel(level)
    return bitsandbytes


def _nf4_linear(linear: nn.Linear, dtype: torch.dtype, device: torch.device) -> nn.Module:
    bnb = _bitsandbytes()
    layer = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=dtype,
        quant_type="nf4",
        device="meta",
    )
    weight = linear.weight.detach().to(dtype)
    layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    # In eval mode on CPUs with AVX-512 BF16, bitsandbytes repacks the weight on the first call
    # into a layout that only some shapes fit, and computes other numbers than in train mode;
    # one kernel for every shape and mode keeps a peer and its local reference equal.
    layer.support_avx512bf16_for_cpu = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return layer.to(device)  # bitsandbytes quantizes the weight as it moves it to the device


def quantize_linear(linear: nn.Linear, quant: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """`linear` in weight format `quant`, computing in `dtype` (the peer's) on `device`, in the
    same train/eval mode as the layer it replaces."""
    if quant == "int8":
        quantized = Int8Linear.from_linear(linear, int8_compute_dtype(dtype)).to(device)
    elif quant == "nf4":
        quantized = _nf4_linear(linear, dtype, device)
    else:
        return linear
    return quantized.train(linear.training)


def quantize_layer(layer: nn.Module, quant: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """Replaces every `nn.Linear` inside `layer` with its `quant` form, in place; returns `layer`.
    Other weights (norms, fused expert tensors) stay as they are."""
    check_quant(quant)
    if quant == "none":
        return layer
    for parent in list(layer.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, quantize_linear(child, quant, dtype, device))
    return layer


def quantize_model(model: nn.Module, quant: str) -> nn.Module:
    """A local Hugging Face causal LM with its decoder layers quantized as a peer quantizes them
    (embeddings and LM head untouched): the reference a chain of `quant` peers must equal."""
    parameter = next(model.parameters())
    for layer in model.model.layers:
        quantize_layer(layer, quant, parameter.dtype, parameter.device)
    return model


def own_storage(module: nn.Module) -> None:
    """Copies the tensors of `module` that still view a memory-mapped checkpoint (a quantized
    block's norms and biases) into memory of their own: a few KB that would otherwise keep the
    block's whole file mapped and resident."""
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.device.type == "cpu" and tensor.dtype.is_floating_point:
                tensor.data = tensor.data.clone()


def release_freed_memory() -> None:
    """Hands the heap's freed pages back to the system (glibc's malloc_trim): quantizing leaves a
    block's full-precision copy freed but, without this, still counted in the peer's memory."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps them, nothing breaks
        pass


def weight_bytes(module: nn.Module) -> int:
    """Bytes `module`'s weights take in memory: parameters, buffers and bitsandbytes' quant states."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    for parameter in module.parameters():
        state = getattr(parameter, "quant_state", None)
        while state is not None:  # nf4's absmax, and with double quantization its own state
            for name in ("absmax", "code", "offset"):
                t = getattr(state, name, None)
                if isinstance(t, torch.Tensor):
                    tensors[id(t)] = t
            state = getattr(state, "state2", None)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def check_backend(quant: str, dtype: torch.dtype, device: torch.device) -> None:
    """Runs a tiny layer in `quant` on `device`: QuantError (one line) if this machine cannot."""
    try:
        check_quant(quant)
    except ValueError as e:
        raise QuantError(str(e)) from None
    if quant == "none":
        return
    try:
        probe = quantize_linear(nn.Linear(64, 64, bias=False, dtype=dtype), quant, dtype, device)
        with torch.inference_mode():
            out = probe(torch.ones(1, 64, dtype=dtype, device=device))
        if not torch.isfinite(out).all():
            raise RuntimeError("the probe layer's output is not finite")
    except ImportError:
        raise QuantError(f"--quant {quant} needs bitsandbytes (pip install bitsandbytes)") from None
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise QuantError(f"--quant {quant} does not run on {device} here: {reason}") from None
