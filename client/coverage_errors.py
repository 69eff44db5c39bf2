"""Why a client cannot route a model: blocks no online peer serves, and the two mismatches that
explain it at once (another checkpoint, or weight formats the client does not accept)."""

from __future__ import annotations

from hexswarm.swarm.tools.terminal_text import printable
from hexswarm.swarm.trust.records import block_ranges


class MissingBlocksError(RuntimeError):
    """No online peer serves some blocks of the model."""

    def __init__(self, model_id: str, missing: list[int], waited_s: float):
        self.model_id, self.missing = model_id, missing
        super().__init__(
            f"after waiting {waited_s:.0f} s, no online peer serves blocks {block_ranges(missing)} of {model_id}"
        )


class ModelMismatchError(MissingBlocksError):
    """The swarm serves other models and none of this client's: its checkpoint differs from the peers'."""

    def __init__(self, model_id: str, num_blocks: int, served: list[str], waited_s: float):
        self.model_id, self.missing, self.served = model_id, list(range(num_blocks)), served
        RuntimeError.__init__(
            self,
            f"this swarm serves {', '.join(printable(s) for s in served)}, not {model_id}: the client's checkpoint differs "
            f"from the peers' (another file or version of the model?); no peer serves blocks "
            f"{block_ranges(self.missing)} of {model_id}",
        )


class FormatMismatchError(MissingBlocksError):
    """Peers serve the missing blocks, but only in weight formats this client does not accept."""

    def __init__(self, model_id: str, missing: list[int], accepted: tuple[str, ...], offered: list[str]):
        self.model_id, self.missing = model_id, missing
        self.accepted, self.offered = accepted, offered
        RuntimeError.__init__(
            self,
            f"blocks {block_ranges(missing)} of {model_id} are served only in weight formats "
            f"{', '.join(offered)}, and this client accepts {', '.join(accepted)}; accept one of them "
            f"(from_pretrained(..., quant=(...)), hexswarm api/generate --quant ...) to use those peers",
        )
