"""What every hexswarm role shares: model spec, DHT records and keys, wire protocol; the coordinator
role; the commands that run no one role and the `hexswarm` dispatcher (docs/architecture.md
"Folder layout")."""

__version__ = "0.1.0"  # setup.cfg reads it; every command's --version prints it
