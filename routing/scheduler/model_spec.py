"""The model being served and the workload it is planned for (plain data, HexGen §4.1 notation).

HexGen's Table 1 writes the parameters of one transformer layer as 12H^2 (four H x H attention
matrices and a 4H MLP) and the key/value cache of one token in one layer as 2H values. Models
with grouped-query attention or a gated MLP differ from that, so `ModelSpec` carries the exact
`layer_params` and `kv_dim`; for a model of the paper's shape they equal 12H^2 and H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, bytes_per_weight

SERVING_MODES = ("pipelined-batched", "sequential")
# What the search maximizes: "slo", the share of requests within the deadline at `rate` (HexGen
# §4); "throughput", tokens/s with every request admitted and no deadline (HexGen-2's objective,
# for offline and batch work): the search offers a saturating rate and ranks plans by what they serve.
OBJECTIVES = ("slo", "throughput")
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float": 4, "half": 2, "int8": 1, "float8": 1}
# Model types whose MLP is fc1 -> act -> fc2 (two matrices); the others use gate/up/down (three).
_PLAIN_MLP = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "phi"}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the cost model sees it."""

    name: str
    num_layers: int  # L
    hidden_size: int  # H
    dtype_bytes: int = 2  # B_type (fp16 = 2)
    layer_params: int = 0  # parameters of one layer; 0 means the paper's 12H^2
    kv_dim: int = 0  # width of K (and of V) per token; 0 means H (multi-head attention)

    def __post_init__(self) -> None:
        if self.num_layers <= 0 or self.hidden_size <= 0 or self.dtype_bytes <= 0:
            raise ValueError(f"model {self.name!r}: layers, hidden size and dtype bytes must be positive")
        if self.layer_params < 0 or self.kv_dim < 0:
            raise ValueError(f"model {self.name!r}: layer_params and kv_dim must not be negative")

    @property
    def params_per_layer(self) -> int:
        """Parameters of one layer (12H^2 in Table 1)."""
        return self.layer_params or 12 * self.hidden_size**2

    @property
    def kv_width(self) -> int:
        """Values of K (or V) per token per layer (H in Table 1)."""
        return self.kv_dim or self.hidden_size

    @property
    def layer_bytes(self) -> float:
        return float(self.params_per_layer * self.dtype_bytes)

    def layer_weight_bytes(self, quant: str = DEFAULT_QUANT) -> float:
        """Bytes of one layer's weights stored in the weight format `quant` (`weight_formats.py`):
        Table 1's 12H^2 B with B the format's bytes per weight; `layer_bytes` for "none"."""
        if quant == DEFAULT_QUANT:
            return self.layer_bytes
        return self.params_per_layer * bytes_per_weight(quant, self.dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all transformer layers (one model replica)."""
        return self.layer_bytes * self.num_layers

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> ModelSpec:
        """Reads a Hugging Face `config.json` dict (Llama, Mistral, Qwen2, OPT, ...)."""
        try:
            layers = int(config["num_hidden_layers"])
            hidden = int(config["hidden_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"config.json lacks num_hidden_layers / hidden_size: {exc}") from exc
        heads = int(config.get("num_attention_heads") or 1)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        ffn = int(config.get("intermediate_size") or config.get("ffn_dim") or 4 * hidden)
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16").replace("torch.", "")
        dtype_bytes = _DTYPE_BYTES.get(dtype, 2)
        gated = str(config.get("model_type", "llama")) not in _PLAIN_MLP
        kv_dim = kv_heads * head_dim
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_dim
        mlp = (3 if gated else 2) * hidden * ffn
        label = name or str(config.get("_name_or_path") or config.get("model_type") or "model")
        return cls(label, layers, hidden, dtype_bytes, attention + mlp, kv_dim)


def _preset(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, model_type: str
) -> ModelSpec:
    config = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "torch_dtype": "float16",
        "model_type": model_type,
    }
    return ModelSpec.from_hf_config(config, name)


# Architecture figures from each model's config.json on the Hugging Face Hub.
PRESETS: dict[str, ModelSpec] = {
    "Llama-2-70B": _preset("Llama-2-70B", 80, 8192, 64, 8, 28672, "llama"),
    "Llama-2-7B": _preset("Llama-2-7B", 32, 4096, 32, 32, 11008, "llama"),
    "OPT-30B": _preset("OPT-30B", 48, 7168, 56, 56, 28672, "opt"),
}


def preset(name: str) -> ModelSpec:
    """Returns a preset by name, case-insensitively ("llama-2-70b" works)."""
    for key, spec in PRESETS.items():
        if key.lower() == name.lower():
            return spec
    raise KeyError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")


@dataclass(frozen=True)
class Workload:
    """Requests the plan must serve: Poisson arrivals (HexGen §4.1, footnote 1) and lengths.

    Input lengths are drawn uniformly from s_in * [1 - s_in_spread, 1 + s_in_spread]; the
    output length is fixed, as in HexGen's evaluation (§5.1: 32, 64, 128 tokens).
    """

    rate: float = 1.0  # requests per second
    s_in: int = 128  # mean prompt tokens
    s_out: int = 32  # generated tokens
    s_in_spread: float = 0.5  # relative half-width of the prompt length range
    slo_scale: float = 5.0  # deadline = slo_scale x reference latency (§5.1; §5.4 uses 5)
    # The reference latency in seconds; None: HexGen's, the whole model on 8 x A100 (§5.1,
    # `cost_model.reference_latency`). A live swarm sets its own (`cost_model.swarm_reference_latency`).
    reference_s: float | None = None
    batch_size: int = 1  # b_t: HexGen serves one request per pipeline pass (Appendix D)
    num_requests: int = 400  # requests per simulated trace
    seed: int = 0  # seed of the simulated trace
    # How the swarm serves it (routing/scheduler/simulation/serving.py): "pipelined-batched" (stages work
    # on different requests at once and batch up to max_batch decode steps, as peers do) or
    # "sequential" (one request per pipeline at a time, the first version's model, an ablation).
    serving: str = "pipelined-batched"
    max_batch: int = 16  # decode steps a stage runs as one; 1 gives pipelining alone
    objective: str = "slo"  # one of OBJECTIVES

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.slo_scale <= 0:
            raise ValueError("rate and slo_scale must be positive")
        if self.reference_s is not None and not (self.reference_s > 0 and math.isfinite(self.reference_s)):
            raise ValueError(f"reference_s must be a positive number of seconds, got {self.reference_s}")
        if self.s_in < 1 or self.s_out < 1 or self.batch_size < 1 or self.num_requests < 1:
            raise ValueError("s_in, s_out, batch_size and num_requests must be at least 1")
        if self.serving not in SERVING_MODES or self.max_batch < 1:
            raise ValueError(f"serving must be one of {SERVING_MODES} and max_batch >= 1")
        if not 0 <= self.s_in_spread < 1:
            raise ValueError("s_in_spread must be in [0, 1)")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")

    @property
    def has_deadline(self) -> bool:
        """False under the throughput objective: no request is late, none is turned away."""
        return self.objective == "slo"

    @property
    def s_in_max(self) -> int:
        return int(round(self.s_in * (1 + self.s_in_spread)))

    @property
    def s_in_min(self) -> int:
        return max(1, int(round(self.s_in * (1 - self.s_in_spread))))
