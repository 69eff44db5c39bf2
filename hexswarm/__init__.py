"""hexswarm: a peer-to-peer swarm that serves large language models over GPUs and CPUs that many
people own.

The code lives in four folders at the checkout's root, installed under this one name so that they
cannot collide with other packages (setup.cfg's `package_dir` maps each one):

- `hexswarm.swarm` (`swarm/`): what every role shares: records, protocol, DHT, keys, the coordinator;
- `hexswarm.peer` (`peer/`): `run-peer`, the server that serves a range of blocks;
- `hexswarm.client` (`client/`): `DistributedModelForCausalLM`, the API server, status and monitor;
- `hexswarm.routing` (`routing/`): the pure solvers (HexGen placement, chain routing) and the
  simulators and baselines the benchmarks compare them with.

`python -m hexswarm` is the `hexswarm` command.
"""

from hexswarm.swarm.tools import lazy_hivemind

lazy_hivemind.install()  # before any hivemind import: its unused parts cost 0.5 s a command

from hexswarm.swarm import __version__  # noqa: E402

__all__ = ["__version__"]
