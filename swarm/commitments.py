"""A hop step's commitment: 16 bytes that bind what a peer computed on to what it returned.

Every STEP_RESULT carries `digest = H(input) || H(output)`, each H an 8-byte BLAKE2b of the
tensor's dtype, shape and bytes as they crossed the wire. The client holds its own copy of
each hop's input (the previous hop's output, which every hop sends it) and of its output, so
it checks both halves on every step (client/remote.py). That is what lets peers push to each
other while the client verifies (client/verify.py): a peer that sends the client one output
and the next peer another is seen at once, because the next peer's digest names the input it
really got. 16 bytes a step is 16 bytes a token on a decode step, and less on a prefill.
"""

from __future__ import annotations

import hashlib

import torch

HALF_BYTES = 8
DIGEST_BYTES = 2 * HALF_BYTES


def tensor_digest(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous()
    digest = hashlib.blake2b(f"{flat.dtype}{tuple(flat.shape)}".encode(), digest_size=HALF_BYTES)
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.digest()


def step_digest(hidden_in: torch.Tensor, output: torch.Tensor) -> bytes:
    """The commitment of a step that computed `output` from `hidden_in`."""
    return tensor_digest(hidden_in) + tensor_digest(output)
