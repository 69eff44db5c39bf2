"""Crossing NATs: what reachable nodes serve those behind one, and how the latter ask. Dial-backs
(`reachability/`), relay slots and their limits (`port_relay`, `relay_limits`), the announce relay
for edge peers that run no DHT node (`announce_relay`), and the tests' homes behind NAT
(`netlab`). It imports from `swarm.tools`, `swarm.wire`, `swarm.net` and `swarm.trust`."""
