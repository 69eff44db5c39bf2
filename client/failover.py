"""Failover, the parts in one place: how a session opens its chain and repairs a failed hop.

A session (client/session.py) holds four parts, each in its own module:

- client.chain_choice `ChainChooser`: chooses chains with the client's router, leaving out
  banned peers, and waits for peers while none forms;
- client.hop_links `HopLinks`: opens a session on each hop's peer, runs steps with deadlines
  from the peer's speed, closes or drops hops;
- client.peer_failures `PeerFailures`: bans, the peers that failed in this call, the retry
  budget, and a `Failover` record per recovery;
- client.span_repair `SpanRepair`: replaces the hops of a span and replays its kept inputs
  through them (`replace`, returning a `Replacement`), retrying until the budget is spent.

They share one `KnownPeers` (client.known_peers), the records every part reads. This module
only names them for callers that import them from here.
"""

from __future__ import annotations

from hexswarm.client.chain_choice import ChainChooser, NoChainError, same_format
from hexswarm.client.hop_links import HopLinks, HopOutput, LiveHop, NextHop, random_session_id
from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.peer_failures import Failover, PeerFailures
from hexswarm.client.span_repair import Replacement, SpanRepair

__all__ = [
    "ChainChooser",
    "Failover",
    "HopLinks",
    "HopOutput",
    "KnownPeers",
    "LiveHop",
    "NextHop",
    "NoChainError",
    "PeerFailures",
    "Replacement",
    "SpanRepair",
    "random_session_id",
    "same_format",
]
