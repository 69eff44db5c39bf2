"""What a reachable node relays for peers behind NAT (swarm/nat/port_relay.py), kept apart so that
the commands' parsers read the defaults without loading the network code (`--help` answers at
once)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RelayLimits:
    """What a relay allows (flags: swarm/commands/cli_args.py add_relay_limits). They fit whole sessions
    of long prompts: a 2,048-token prefill at hidden size 8,192 in fp16 is 32 MiB a hop."""

    max_slots: int = 128  # peers relayed at once
    max_slots_per_group: int = 8  # ... from one IP group (/24, /48): identities cost nothing, machines do
    max_connections: int = 16  # open connections to one relayed peer
    max_connections_per_group: int = 4  # ... from one IP group: one machine cannot take them all
    data_limit_bytes: int = 64 << 30  # per connection and direction, then it is closed
    time_limit_s: float = 24 * 3600  # per connection, then it is closed
