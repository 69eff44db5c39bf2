"""hivemind's package, loaded lazily: its `__init__` runs only when a name it defines is used.

`import hivemind.dht` first runs `hivemind/__init__.py`, which imports every part of hivemind:
the averager, MoE and optimizer too, and through them scipy.optimize. No hexswarm process uses
those parts, and they cost about 0.5 s of each command's start (`hexswarm status` spent 2.3 s
importing, 0.5 of it there). `install()` registers the package as an empty module with
hivemind's own path, so `hivemind.dht`, `hivemind.p2p` and `hivemind.utils` import as usual;
the first attribute read from the package itself (`hivemind.DHT`, `from hivemind import X`)
runs the real `__init__` into that module, so code that expects all of hivemind still gets it.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def install() -> None:
    """Registers hivemind's package lazily; a no-op if it is imported already or not installed
    (an edge peer's environment has no hivemind)."""
    if "hivemind" in sys.modules:
        return
    spec = importlib.util.find_spec("hivemind")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    package.__getattr__ = _load_on_first_use(package)
    sys.modules["hivemind"] = package


def _load_on_first_use(package: ModuleType):
    def __getattr__(name: str):
        # `import hivemind.p2p.x as y` reads `hivemind.p2p` while hivemind.p2p is still loading
        submodule = sys.modules.get(f"{package.__name__}.{name}")
        if submodule is not None:
            return submodule
        del package.__getattr__  # once: the real __init__ defines what follows
        package.__spec__.loader.exec_module(package)
        return getattr(package, name)

    return __getattr__
