"""`run-peer`: serve a range of a model's transformer layers to the swarm.

Its own flags live in peer/flags.py, the coordinator's in swarm/coordinator/command.py. torch and the peer's own modules load only once they are
parsed, so `run-peer --help` answers at once; every check that needs the model (the range,
the tensor-parallel degree, the devices) runs before anything loads or joins the swarm.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from hexswarm.swarm.tools.open_files import raise_open_files_limit
from hexswarm.swarm.tools.threads import configure_openmp

configure_openmp()  # before torch loads (see swarm/tools/threads.py)

# ruff: noqa: E402
from hexswarm.peer.flags import peer_parser
from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.commands.cli_args import UsageError
from hexswarm.swarm.coordinator.command import add_coordination_arguments
from hexswarm.swarm.net.dht import InitialPeersError
from hexswarm.swarm.tools import log_setup
from hexswarm.swarm.tools.fast_exit import exit_now


def build_parser():
    """run-peer's parser: its own flags and those of the coordinator it may run (`--coordinator`)."""
    parser = peer_parser()
    add_coordination_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parses the flags and serves; a peer that ran exits the process itself (see exit_now)."""
    args = build_parser().parse_args(argv)
    # before the DHT child forks, which keeps this set-up; the model's id replaces its name below
    log_setup.setup_logging(args, log_context(args.name, os.path.basename(args.model), f"[{args.layers}]"))
    joining = None
    raise_open_files_limit()  # inherited by the DHT child and its p2pd
    try:
        cli_args.check_model(args.model)  # before the DHT node starts: a typo answers at once
        from hexswarm.peer.joining import joins_as_client, start_joining  # hivemind: after --help, errors

        joining = start_joining(
            tuple(args.initial_peers), args.identity, tuple(args.host_maddrs), tuple(args.announce_maddrs),
            joins_as_client(args.reachability, args.host_maddrs),
        )  # it joins while the model code loads (peer/joining.py)  # fmt: skip
        config = peer_config(args)
    except (UsageError, InitialPeersError) as e:
        if joining is not None:
            joining.abandon()
        return cli_args.usage_error("run-peer", str(e))
    from hexswarm.peer.runtime import serve

    layers = "[auto]" if config.auto else f"[{config.start}:{config.end})"
    # the name, when not given, is known once the peer has joined (peer/runtime.py updates it)
    log_setup.set_context(log_context(args.name, config.spec.model_id, layers))
    try:
        code = asyncio.run(serve(config, joining))
    except InitialPeersError as e:
        code = cli_args.usage_error("run-peer", str(e))
    exit_now(code)


def peer_config(args: argparse.Namespace):
    """The PeerConfig the flags ask for; UsageError for what the parser alone cannot check."""
    from hexswarm.peer import faults
    from hexswarm.peer.admission import AdmissionLimits
    from hexswarm.peer.config import PeerConfig
    from hexswarm.peer.core import PeerLimits
    from hexswarm.peer.debug import parse_record_override
    from hexswarm.swarm.coordinator.command import coordinator_config
    from hexswarm.swarm.coordinator.records import trust_from

    if args.role == "auto" and args.layers != "auto":
        raise UsageError("--role auto needs --layers auto: the coordinator's plan gives a peer both")
    spec, (start, end), devices, tp_choices, prefill_threads = _load(args)
    try:
        coordinator_trust = trust_from(_coordinator_keys(args), public=args.public)
        coordinator = coordinator_config(args, args.model) if args.coordinator else None
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None
    max_sessions, max_length = args.max_sessions, args.max_length
    dtype = choose_dtype(args.dtype, devices[0], getattr(spec.config, "dtype", None))
    _check_quant(args.quant, dtype, devices)
    slowdowns = _check_partition(args, spec, end - start, dtype, devices, tp_choices)
    blocks = (args.max_blocks or spec.num_blocks) if args.layers == "auto" else end - start
    cache_tokens = args.cache_tokens or default_cache_tokens(args, spec, blocks, dtype, devices)
    return PeerConfig(
        spec=spec,
        start=start,
        end=end,
        initial_peers=tuple(args.initial_peers),
        host_maddrs=tuple(args.host_maddrs),
        announce_maddrs=tuple(args.announce_maddrs),
        reachability=args.reachability,
        relay_limits=cli_args.relay_limits(args),
        identity_path=args.identity,
        name=args.name,
        devices=devices,
        tp_choices=tp_choices if len(tp_choices) > 1 else (),
        dtype=dtype,
        quant=args.quant,
        role=args.role,
        limits=PeerLimits(
            max_sessions=max_sessions,
            max_length=max_length,
            max_batch=args.max_sequences_per_session,
            cache_tokens=cache_tokens,
            session_cache_tokens=args.max_session_cache_tokens or max(cache_tokens // 4, max_length),
            session_idle_timeout=args.session_idle_timeout,
        ),
        announce_period=args.announce_period,
        drain_timeout=args.drain_timeout,
        max_frame_bytes=int(args.max_frame_mb * (1 << 20)),
        max_buffered_bytes=int(args.max_buffered_mb * (1 << 20)),
        handshake_timeout=args.handshake_timeout,
        throughput=args.throughput,
        decode_ms=args.decode_ms,
        tp_timeout=args.tp_timeout,
        partition=args.partition,
        slowdowns=slowdowns,
        auto=args.layers == "auto",
        max_blocks=args.max_blocks,
        region=args.region,
        rebalance_period=args.rebalance_period,
        move_wait=args.move_wait,
        coordinator=coordinator,
        coordinator_trust=coordinator_trust,
        batch=batch_policy(args),
        faults=faults.plan_from_args(args),
        admission=AdmissionLimits(
            sessions_per_remote=args.max_sessions_per_peer,
            steps_per_second=args.max_steps_per_second,
            cache_share_per_remote=args.cache_share_per_peer,
            group_factor=args.ip_group_share,
        ),
        debug_corrupt_outputs=args.debug_corrupt_outputs,
        debug_slow_ms=args.debug_slow_ms,
        debug_record=dict(map(parse_record_override, args.debug_record)),
        prefill_threads=prefill_threads,
    )


def _coordinator_keys(args: argparse.Namespace) -> list[str] | None:
    """--coordinator-key, else in the public swarm the keys its shipped list names."""
    if args.coordinator_key or not args.public:
        return args.coordinator_key
    from hexswarm.swarm.net.dht import public_coordinator_keys

    return public_coordinator_keys() or None


def _load(args: argparse.Namespace):
    """(spec, (start, end), devices, TP degrees the plan may choose, prefill threads) from the
    model, --layers, --tp and the devices; sets torch's threads. UsageError on a bad one."""
    import torch

    from hexswarm.peer.devices import DeviceError, cpu_cores, default_cpu_threads, parse_devices
    from hexswarm.peer.tp.shard import TPDegreeError, check_degree, check_uneven_degree, valid_degrees
    from hexswarm.swarm.models.model_spec import ModelSpecError, load_model_spec

    try:
        spec = load_model_spec(args.model)
    except (ModelSpecError, OSError) as e:
        raise UsageError(str(e)) from None
    auto = args.layers == "auto"
    start, end = (0, spec.num_blocks) if auto else parse_layers(args.layers, spec.num_blocks)
    tp_auto = args.tp is None
    if tp_auto:  # one rank per offered device
        args.tp = len(args.devices.split(",")) if args.devices else 1
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    try:  # before anything loads or joins the swarm
        devices = parse_devices(args.devices, args.tp, device)
        if args.partition == "auto":
            check_uneven_degree(spec.config, args.tp)
        else:
            check_degree(spec.config, args.tp)
    except (DeviceError, TPDegreeError) as e:
        raise UsageError(str(e)) from None
    # --layers auto --tp auto: the plan chooses the degree too, among those that split the model.
    tp_choices = valid_degrees(spec.config, args.tp) if auto and tp_auto else ()
    prefill_threads = None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif devices[0].type == "cpu" and len(devices) == 1:
        torch.set_num_threads(default_cpu_threads(spec.config))
        prefill_threads = cpu_cores()  # decode may run on one thread; a long prompt wants every core
    return spec, (start, end), devices, tp_choices, prefill_threads


def parse_layers(text: str, num_blocks: int) -> tuple[int, int]:
    """[A, B) from "A:B"; a UsageError when it does not fit the model."""
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise UsageError(f"--layers must look like A:B or auto, got {text!r}") from None
    if not 0 <= start < end <= num_blocks:
        raise UsageError(f"--layers {text} is not inside 0:{num_blocks} for this model")
    return start, end


def choose_dtype(name: str, device, checkpoint_dtype):
    """The torch dtype of --dtype: `auto` is the checkpoint's on GPU (when 16-bit), float32 on CPU."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda" and checkpoint_dtype in (torch.float16, torch.bfloat16):
        return checkpoint_dtype
    return torch.float32 if device.type == "cpu" else torch.float16


def _check_quant(quant: str, dtype, devices) -> None:
    """Runs a tiny layer in the asked weight format on each device: UsageError if one cannot."""
    from hexswarm.peer.quant import QuantError, check_backend

    try:
        for device in sorted(set(devices), key=str):
            check_backend(quant, dtype, device)
    except QuantError as e:
        raise UsageError(str(e)) from None


UNEVEN_FAMILIES = ("llama", "mistral", "qwen2")  # attention and a dense MLP, nothing else split


def _check_partition(args: argparse.Namespace, spec, blocks: int, dtype, devices, tp_choices) -> dict:
    """--partition auto's checks before anything loads: a family and degree it can split, and a
    split that fits the ranks' free memory (Hepti's LP with equal speeds: memory alone decides
    whether one exists). Returns --debug-slowdown's rank -> Slowdown."""
    from hexswarm.peer.tp.partition import RankProfile, hepti_problem, layer_shape
    from hexswarm.peer.tp.profile import free_bytes, parse_slowdown
    from hexswarm.routing.hepti.split import HeptiInfeasibleError, plan_split
    from hexswarm.routing.scheduler.weight_formats import bytes_per_weight

    try:
        slowdowns = dict(parse_slowdown(text) for text in args.debug_slowdown)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.partition == "even":
        return slowdowns
    if len(devices) < 2 or tp_choices:
        raise UsageError("--partition auto splits a fixed --tp K group of at least 2 ranks")
    if spec.model_type not in UNEVEN_FAMILIES:
        raise UsageError(
            f"--partition auto splits {', '.join(UNEVEN_FAMILIES)} models, not {spec.model_type}"
        )
    import torch

    element = torch.tensor([], dtype=dtype).element_size()
    shape = layer_shape(spec.config.to_dict(), blocks, bytes_per_weight(args.quant, element))
    profiles = [RankProfile(1.0, free_bytes(d, len(devices)), 0.0, float("inf")) for d in devices]
    try:
        plan_split(hepti_problem(shape, profiles))
    except (HeptiInfeasibleError, ValueError) as e:
        raise UsageError(f"--partition auto: {e}") from None
    return slowdowns


def default_cache_tokens(args: argparse.Namespace, spec, blocks: int, dtype, devices) -> int:
    """--cache-tokens' default: room for --max-sessions sessions of --max-length tokens, as far as
    the memory left beside this peer's weights holds their keys and values (at least one session).

    The weights are counted in their --quant format, so a quantized peer keeps a larger cache
    where memory binds. Memory: 90% of the GPUs', or half the RAM on a CPU.
    """
    import torch

    from hexswarm.peer.devices import describe
    from hexswarm.routing.scheduler.model_spec import ModelSpec as CostSpec
    from hexswarm.routing.scheduler.weight_formats import bytes_per_weight

    wanted = args.max_sessions * args.max_length
    try:
        cost = CostSpec.from_hf_config(spec.config.to_dict())
    except ValueError:  # a config the cost model cannot size (nested text config): no memory bound
        return wanted
    dtype_bytes = torch.tensor([], dtype=dtype).element_size()
    infos = [describe(d, None) for d in devices]
    on_gpu = [i.memory_bytes for i in infos if i.type == "cuda"]
    memory = 0.9 * sum(on_gpu) if on_gpu else infos[0].memory_bytes / 2
    weights = blocks * cost.params_per_layer * bytes_per_weight(args.quant, dtype_bytes)
    kv_per_token = blocks * 2 * cost.kv_width * dtype_bytes
    fits = int(max(memory - weights, 0) // max(kv_per_token, 1))
    return max(min(wanted, fits), args.max_length)


def batch_policy(args: argparse.Namespace):
    """The compute thread's BatchPolicy from the batching flags (their ranges are checked by the parser)."""
    from hexswarm.peer.scheduler import BatchPolicy

    return BatchPolicy(
        batching=not args.no_batching,
        batch_window_ms=args.batch_window_ms,
        max_batch_tokens=args.max_batch_sequences,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        interleave_ratio=args.interleave_ratio,
        align_ratio=args.align_ratio,
    )


def log_context(name: str | None, model_id: str, layers: str) -> str:
    """What a peer's log lines are about: `peer alice tiny-3f2a[0:4)` (layers "[auto]" until placed)."""
    return f"peer {name + ' ' if name else ''}{model_id}{layers}"


if __name__ == "__main__":
    sys.exit(main())
