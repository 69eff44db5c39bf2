"""What every hexswarm role shares: model spec, DHT records and keys, wire protocol, CLI."""

__version__ = "0.1.0"
