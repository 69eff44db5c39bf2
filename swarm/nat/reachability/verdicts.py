"""Judging dial-back replies, on the asker's side: what a peer announces from what helpers say.
Pure: replies (and the IP groups of the asker's own connections to the helpers) in, addresses
out. The threat: any stranger serving the model may be asked, and may lie."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Sequence

from hexswarm.swarm.nat.port_relay import Slot
from hexswarm.swarm.nat.reachability.messages import DialBackReply
from hexswarm.swarm.net.maddrs import ip_group, peer_id_of, tcp_addr, with_peer_id


def reached_addrs(replies: Sequence[DialBackReply | None], peer_id: str) -> tuple[str, ...]:
    """The addresses helpers reached us at, each with our id."""
    return _announceable([dialed for r in replies if r is not None for _, dialed in r.reached], peer_id)


def agreed_addrs(replies: Sequence[DialBackReply | None], peer_id: str) -> tuple[str, ...]:
    """The addresses at least half of the helpers that answered reached us at (as
    `reachable_verdict` counts), so that among three or more answers one lying helper cannot
    choose what a direct peer announces (of two, a tie keeps both). If no address has half the
    votes (the helpers reached different ones), every address reached."""
    answered = [r for r in replies if r is not None and not r.error]
    votes = Counter(dialed for r in answered for dialed in dict.fromkeys(d for _, d in r.reached))
    agreed = [addr for addr, n in votes.items() if 2 * n >= len(answered)]
    return _announceable(agreed, peer_id) if agreed else reached_addrs(replies, peer_id)


def confirmed_addrs(
    replies: Sequence[DialBackReply | None],
    groups: dict[str, str],
    initial_peers: Sequence[str],
    peer_id: str,
) -> tuple[str, ...]:
    """The addresses a direct peer announces: each reached by helpers of at least two IP groups
    (`groups`: helper -> the group of our own connection to it), one of them an initial peer
    when any answered. Where the initial peers all share one IP group (a lab, a private swarm
    behind one address) and they answered, what at least half of them reached (agreed_addrs):
    the user chose that group. Else none: one group of strangers cannot place an address."""
    answered = [r for r in replies if r is not None and not r.error]
    chosen = {peer_id_of(a) for a in initial_peers}
    theirs = [r for r in answered if r.helper in chosen]
    seen: dict[str, set[str]] = {}
    for r in answered:
        for dialed in {d for _, d in r.reached}:
            if groups.get(r.helper):
                seen.setdefault(dialed, set()).add(groups[r.helper])
    named = {d for r in theirs for _, d in r.reached}
    two = [a for a, g in seen.items() if len(g) >= 2 and (a in named or not theirs)]
    if two:
        return _announceable(two, peer_id)
    if (
        theirs
        and len(_groups_of(initial_peers)) == 1
        and {groups.get(r.helper) for r in theirs} <= _groups_of(initial_peers)
    ):
        return agreed_addrs(theirs, peer_id)
    return ()


def _groups_of(addrs: Sequence[str]) -> set[str]:
    return {ip_group(a.ip) if a else "" for a in map(tcp_addr, addrs)}


def relay_verified(
    slots: Sequence[Slot], replies: Sequence[DialBackReply | None], peer_id: str
) -> tuple[str, ...]:
    """The slot addresses whose own relay dialed us through them (reply i answers slot i)."""
    return tuple(
        slot.addr(peer_id)
        for slot, r in zip(slots, replies, strict=True)
        if r is not None
        and not r.error
        and r.helper == slot.relay_id
        and any(asked == slot.addr(peer_id) for asked, _ in r.reached)
    )


def chosen_first(replies: Sequence[DialBackReply | None], initial_peers: Sequence[str]) -> list:
    """The answers of the initial peers, when any of them answered: the user chose those nodes,
    while any stranger serving the model may be asked too, and a few Sybil helpers would
    otherwise outvote the bootstrap and choose what the peer announces. Else every answer."""
    chosen = {peer_id_of(a) for a in initial_peers}
    theirs = [r for r in replies if r is not None and not r.error and r.helper in chosen]
    return theirs or list(replies)


def observed_group(replies: Sequence[DialBackReply | None]) -> str:
    """The IP group most helpers saw this peer's connection come from ("" if none said)."""
    seen = Counter(
        ip_group(r.observed_ip) for r in replies if r is not None and not r.error and _is_ip(r.observed_ip)
    )
    return seen.most_common(1)[0][0] if seen else ""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _announceable(dialed: list[str], peer_id: str) -> tuple[str, ...]:
    # a loopback address is worth announcing only when nothing else was reached (one machine)
    remote = [a for a in dialed if not ipaddress.ip_address(tcp_addr(a).ip).is_loopback]
    return tuple(dict.fromkeys(with_peer_id(a, peer_id) for a in remote or dialed))
