"""What every hexswarm role shares, one concern a sub-package, bottom to top: `tools` (logging,
threads, cache files, process launchers), `wire` (the protocol), `models` (spec and checkpoints),
`net` (the DHT node, identity, addresses), `trust` (records, evidence, bans, reports), `nat`
(dial-backs and relays), the coordinator role (`coordinator`), and the commands that run no one
role with the `hexswarm` dispatcher (`commands`). docs/architecture.md "Folder layout" has the
map; tests/unit/test_layering.py holds what each may import."""

__version__ = "0.1.0"  # setup.cfg reads it; every command's --version prints it
