"""What the swarm may believe, and whom: the records peers sign and announce (`records`, their
field bounds in `record_checks`, reading signed entries in `signed_entries`, signing without
hivemind in `dht_signing`), the evidence anyone can re-check and how it travels (`evidence`,
`evidence_wire`, the calibrated comparison in `verify_tolerance`), this machine's bans (`bans`),
reports and speed reports in the DHT (`reports`, `speed_reports`) and rate limits (`rates`). It
imports from `swarm.tools`, `swarm.wire` and `swarm.net`."""
