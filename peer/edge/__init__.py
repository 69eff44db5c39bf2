"""The edge peer: serves a layer range over py-libp2p, in a process without hivemind or p2pd,
for machines where hivemind's daemon does not run (docs/architecture.md "Edge peers")."""
