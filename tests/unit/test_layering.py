"""The floors of hexswarm's imports, read from the code itself (`ast`), so the layering that
docs/architecture.md#folder-layout describes stays true.

Bottom to top: `routing/` (pure solvers) -> `swarm/` (what every role shares) -> `peer/` and
`client/` (the roles, which never import each other) -> the commands. A command lives in the
package of the role it runs, so the commands are a floor of modules rather than a folder: no
other module imports one. The `hexswarm` dispatcher (swarm/commands/cli.py) sits above
everything: it names every command's module in its table and imports it only when that verb runs.

Inside a floor, its parts (sub-packages) say what they may import of each other as data
(PARTS): `swarm/` from its tools at the bottom, through the wire protocol, models, the DHT
node, trust and crossing NATs, to the coordinator and the commands; `peer/tp/` and
`peer/edge/` stand on the peer's own modules, `client/api/` on the client's. No two modules
import each other, not even for a type checker (a `typing.Protocol` or a type moved to the
module both use ends such a pair).

Inside `routing/`, the solver packages a live swarm calls (`routing.scheduler`: placement, for
the coordinator and `hexswarm plan`; `routing.chains`: chain routing, for the client) stand on
nothing that only measures them: the seeded scenarios, the simulators of a swarm over time and
the baselines sit on floors above them. `routing/` imports nothing of ours above it and no
library beyond its numeric ones (no torch, no network), and no import in it runs in a circle;
nor does any import elsewhere, `if TYPE_CHECKING:` imports included.

Every import counts: at module level, inside a function, and `importlib.import_module` with a
literal name. The four folders install as `hexswarm.routing`, `hexswarm.swarm`, `hexswarm.peer`
and `hexswarm.client` (setup.cfg), and every import names them so: a bare `import client` would
load a second copy of a module, or another package of that name.

The shape holds inside a floor too: a module stays under MAX_MODULE_LINES, so that it does one
thing its name says and reads whole (STYLE.md: around 400 lines or less). The few that do not
yet are listed in LONG_MODULES, each with why, and leave the list once they are split.
"""

from __future__ import annotations

import ast
import configparser
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "hexswarm"

# package -> floor; a module may import from its own floor and the ones below
FLOORS = {"routing": 0, "swarm": 1, "peer": 2, "client": 2}
ROLES = ("peer", "client")
DISPATCHER = "hexswarm.swarm.commands.cli"

# routing's packages -> floor: the solvers a live swarm calls at the bottom, then what only
# benchmarks and tests use; a module may import from its own floor and the ones below
ROUTING_FLOORS = {
    "hexswarm.routing.scheduler": 0,  # placement (HexGen): the coordinator and `hexswarm plan`
    "hexswarm.routing.chains": 0,  # chain routers: the client
    "hexswarm.routing.disaggregation": 0,  # prefill and decode replicas (HexGen-2): the coordinator
    "hexswarm.routing.hepti": 0,  # uneven tensor-parallel splits (Hepti): the peer and `hexswarm plan`
    "hexswarm.routing.scenarios": 1,  # seeded clusters, swarms and churn
    "hexswarm.routing.sim": 2,  # simulators of a swarm over time
    "hexswarm.routing.baselines": 3,  # what the benchmarks compare the solvers with
}
# a floor's parts -> the parts of the same floor its modules may import besides their own ("":
# the floor's modules outside every part; a floor without "" has none but its `__init__`). A
# module may always import its floor's package itself (`hexswarm.swarm.__version__`).
PARTS: dict[str, dict[str, set[str]]] = {
    "swarm": {  # bottom to top
        "tools": set(),  # logging, threads, cache files, process launchers: nothing of ours
        "wire": set(),  # the protocol, frames, tensors, commitments
        "models": {"tools"},  # spec, checkpoints, content hashes
        "net": {"tools"},  # the DHT node, identity, addresses, dialing
        "trust": {"tools", "wire", "net"},  # records, evidence, bans, reports, rates
        "nat": {"tools", "wire", "net", "trust"},  # dial-backs, relays, the announce relay
        "commands": {"tools", "wire", "models", "net", "trust", "nat"},  # bootstrap, models, demo ...
        # the coordinator role; of the commands it reads only cli_args, the flags its two commands
        # share with every command (test_only_commands_import_commands keeps the rest apart)
        "coordinator": {"tools", "wire", "models", "net", "trust", "nat", "commands"},
    },
    "peer": {
        "": {"tp"},  # the peer's own modules: serving, runtime, blocks, ...
        "tp": {""},  # tensor-parallel groups
        "edge": {""},  # the edge peer over py-libp2p: no tensor parallelism
    },
    "client": {
        "": set(),  # the client's own modules: sessions, discovery, observers
        "api": {""},  # the OpenAI-compatible API, above the rest of the client
    },
}
SOLVERS = tuple(package for package, floor in ROUTING_FLOORS.items() if floor == 0)
# DESIGN.md: routing/ is pure algorithms on these libraries, besides Python's own modules but
# those that reach the network or other processes
ROUTING_LIBRARIES = {"numpy", "scipy", "pymoo", "networkx"}
NETWORK_MODULES = {"socket", "ssl", "asyncio", "http", "urllib", "subprocess", "multiprocessing"}

MAX_MODULE_LINES = 450
# module -> why it is longer for now; each one is split by what it does, not cut at a line
LONG_MODULES: dict[str, str] = {}


def module_name(path: Path) -> str:
    """`swarm/coordinator/command.py` -> `hexswarm.swarm.coordinator.command` (a package is its
    `__init__`)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join((NAMESPACE, *parts) if parts[0] in FLOORS else parts)


def path_of(name: str) -> Path:
    """`hexswarm.swarm.trust.records` -> ROOT/swarm/trust/records (no suffix): where setup.cfg maps it."""
    parts = name.split(".")
    return ROOT.joinpath(*(parts[1:] if parts[0] == NAMESPACE and len(parts) > 1 else parts))


def imports_of(path: Path, type_checking: bool = True) -> set[str]:
    """The absolute names of every module `path` imports, anywhere in the file. `from a import b`
    gives `a`, and `a.b` too where `b` is one of this project's modules; relative imports are
    resolved. `type_checking` False leaves out the `if TYPE_CHECKING:` blocks (never run)."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    if not type_checking:
        tree = _WithoutTypeChecking().visit(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node.level, node.module)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if _is_ours(f"{base}.{alias.name}"))
        elif isinstance(node, ast.Call) and _called(node.func) == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return names


class _WithoutTypeChecking(ast.NodeTransformer):
    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = node.test
        if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
            return None if not node.orelse else node.orelse
        return self.generic_visit(node)


def _absolute(path: Path, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `path`."""
    if not level:
        return module or ""
    package = module_name(path).split(".")[: -1 if path.name != "__init__.py" else None]
    return ".".join([*package[: len(package) - level + 1], *([module] if module else [])])


def _is_ours(name: str) -> bool:
    path = path_of(name)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def package_modules() -> Iterator[tuple[str, Path]]:
    """(module name, path) of every module in the four packages."""
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield module_name(path), path


def top(name: str) -> str:
    """The package of ours a module is in (`hexswarm.peer.cli` -> `peer`), else its top name."""
    parts = name.split(".")
    return parts[1] if parts[0] == NAMESPACE and len(parts) > 1 else parts[0]


def bare(name: str) -> bool:
    """Whether `name` reaches one of our packages without the namespace (`client.model`)."""
    return name.split(".")[0] in FLOORS


def package_of(name: str, packages: Iterable[str]) -> str | None:
    """The package of `packages` that holds module `name` (itself or a parent), if any."""
    return next((p for p in packages if name == p or name.startswith(p + ".")), None)


def import_graph(prefix: str, type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports, for the modules under `prefix` (e.g.
    "hexswarm.routing") and only the imports among them (`type_checking`: see imports_of)."""
    modules = {name: path for name, path in package_modules() if package_of(name, [prefix])}
    return {name: imports_of(path, type_checking) & modules.keys() - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def dispatched_modules() -> dict[str, str]:
    """The dispatcher's table, read without importing it: verb -> command module."""
    tree = ast.parse((ROOT / "swarm" / "commands" / "cli.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SUBCOMMANDS":
            return {verb: module for verb, (module, _) in ast.literal_eval(node.value).items()}
    raise AssertionError("swarm/commands/cli.py has no SUBCOMMANDS table")


def command_modules() -> set[str]:
    """Every module that is a command: the dispatcher's verbs, the console scripts, `__main__`s."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"].strip().splitlines()
    commands = set(dispatched_modules().values())
    commands.update(line.split("=")[1].strip().split(":")[0] for line in scripts)
    commands.update(name for name, path in package_modules() if path.name == "__main__.py")
    return commands


def part_of(name: str) -> str | None:
    """The part of its floor (PARTS) that module `name` is in: the longest that holds it, "" for
    the floor's own modules, None outside the floors with parts."""
    floor = top(name)
    if floor not in PARTS or not name.startswith(f"{NAMESPACE}.{floor}"):
        return None
    parts = sorted((p for p in PARTS[floor] if p), key=len, reverse=True)
    return next((p for p in parts if package_of(name, [f"{NAMESPACE}.{floor}.{p}"])), "")


def test_imports_of_reads_every_kind_of_import(tmp_path):
    path = tmp_path / "example.py"
    path.write_text(
        "import os.path\n"
        "from hexswarm.swarm.trust import records\n"
        "def later():\n"
        "    from hexswarm.client.swarm_client import SwarmClient\n"
        "    importlib.import_module('hexswarm.peer.cli')\n"
    )
    assert imports_of(path) == {
        "os.path",
        "hexswarm.swarm.trust",
        "hexswarm.swarm.trust.records",
        "hexswarm.client.swarm_client",
        "hexswarm.peer.cli",
    }


def test_every_import_of_ours_goes_through_the_namespace():
    """The packages, their tests, the benchmarks and the scripts."""
    files = [
        path
        for folder in (*FLOORS, "hexswarm", "tests", "benchmarks", "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in sorted(imports_of(path))
        if bare(name)
    ]
    assert not found, "imports without `hexswarm.`:\n" + "\n".join(found)


def test_no_module_imports_from_a_higher_floor():
    upward = [
        f"{name} imports {imported} ({top(name)} is floor {FLOORS[top(name)]}, "
        f"{top(imported)} is floor {FLOORS[top(imported)]})"
        for name, path in package_modules()
        if name != DISPATCHER
        for imported in sorted(imports_of(path))
        if top(imported) in FLOORS and FLOORS[top(imported)] > FLOORS[top(name)]
    ]
    assert not upward, "imports that run back up a floor:\n" + "\n".join(upward)


def test_the_roles_never_import_each_other():
    across = [
        f"{name} imports {imported}"
        for name, path in package_modules()
        if top(name) in ROLES
        for imported in sorted(imports_of(path))
        if top(imported) in ROLES and top(imported) != top(name)
    ]
    assert not across, "peer/ and client/ import each other:\n" + "\n".join(across)


def test_only_commands_import_commands():
    """A command is the top of its role: library code below it never reaches up into one."""
    commands = command_modules()
    reaching_up = [
        f"{name} imports the command {imported}"
        for name, path in package_modules()
        if name not in commands and name != DISPATCHER
        for imported in sorted(imports_of(path) & commands)
    ]
    assert not reaching_up, "\n".join(reaching_up)


def test_the_dispatcher_imports_its_commands_only_by_name():
    """`hexswarm --help` loads no role: the dispatcher's own imports stay on swarm's floor, and
    each verb's module (the only names above it) is imported when that verb runs."""
    upward = [
        imported
        for imported in imports_of(ROOT / "swarm" / "commands" / "cli.py")
        if top(imported) in FLOORS and FLOORS[top(imported)] > FLOORS["swarm"]
    ]
    assert not upward


@pytest.mark.parametrize("verb,module", sorted(dispatched_modules().items()))
def test_each_verb_names_a_command_module_of_a_package(verb, module):
    path = path_of(module).with_suffix(".py")
    assert top(module) in FLOORS and path.is_file(), f"hexswarm {verb}: no module {module}"
    defined = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
    assert {"add_arguments", "run"} <= defined, f"hexswarm {verb}: {module} is not a command"


def test_circles_finds_each_circle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}, "f": {"a"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_solvers_import_nothing_that_only_measures():
    """The solver packages hold what a live swarm calls; simulators, baselines and scenarios
    stand on them, never the other way."""
    apart = [package for package, floor in ROUTING_FLOORS.items() if floor > 0]
    wrong = [
        f"{name} imports {imported}"
        for name, path in package_modules()
        if package_of(name, SOLVERS)
        for imported in sorted(imports_of(path))
        if package_of(imported, apart)
    ]
    assert not wrong, "a solver imports a simulator, baseline or scenario:\n" + "\n".join(wrong)


def test_routing_packages_import_only_from_their_floor_or_below():
    upward = []
    for name, path in package_modules():
        own = package_of(name, ROUTING_FLOORS)
        for imported in sorted(imports_of(path)):
            other = package_of(imported, ROUTING_FLOORS)
            if own and other and ROUTING_FLOORS[other] > ROUTING_FLOORS[own]:
                upward.append(
                    f"{name} ({own}, floor {ROUTING_FLOORS[own]}) imports {imported} (floor {ROUTING_FLOORS[other]})"
                )
    assert not upward, "\n".join(upward)


def test_every_routing_module_is_in_a_package_with_a_floor():
    """A new package under routing/ says where it stands (ROUTING_FLOORS) before it is used."""
    homeless = [
        name
        for name, _ in package_modules()
        if top(name) == "routing" and name != "hexswarm.routing" and not package_of(name, ROUTING_FLOORS)
    ]
    assert not homeless


def test_routing_imports_nothing_of_ours_above_it_nor_torch_or_the_network():
    """Pure algorithms: Python's own modules, routing's, and its numeric libraries only."""
    allowed = (set(sys.stdlib_module_names) - NETWORK_MODULES) | ROUTING_LIBRARIES | {"routing"}
    foreign = [
        f"{name} imports {imported}"
        for name, path in package_modules()
        if top(name) == "routing"
        for imported in sorted(imports_of(path))
        if top(imported) not in allowed
    ]
    assert not foreign, "\n".join(foreign)


def test_no_import_circle_in_routing():
    found = circles(import_graph("hexswarm.routing"))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_circle_anywhere():
    """Modules that import each other in a circle (even inside functions, even only for a type
    checker) are one module split in the wrong place."""
    found = circles(import_graph(NAMESPACE))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_two_modules_import_each_other():
    """The shortest circle, named pair by pair: `if TYPE_CHECKING:` imports count too (a
    `typing.Protocol`, or the shared type moved to the module both import, ends one)."""
    graph = import_graph(NAMESPACE)
    pairs = sorted(
        {tuple(sorted((a, b))) for a, imported in graph.items() for b in imported if a in graph.get(b, ())}
    )
    assert not pairs, "modules that import each other:\n" + "\n".join(f"{a} <-> {b}" for a, b in pairs)


def test_each_part_imports_only_the_parts_it_may():
    """PARTS, module by module: an import of another part of the same floor is one that part's
    row allows (a part's own modules, and the floor's package itself, are always allowed)."""
    wrong = []
    for name, path in package_modules():
        own = part_of(name)
        if own is None or name == DISPATCHER:
            continue
        floor = top(name)
        for imported in sorted(imports_of(path)):
            other = part_of(imported)
            if top(imported) != floor or other is None or imported == f"{NAMESPACE}.{floor}" or other == own:
                continue
            if other not in PARTS[floor][own]:
                wrong.append(
                    f"{name} ({floor}/{own or '.'}) imports {imported} ({floor}/{other or '.'}); "
                    f"{floor}/{own or '.'} may import {sorted(PARTS[floor][own]) or 'no other part'}"
                )
    assert not wrong, "imports across the parts of a floor that PARTS does not allow:\n" + "\n".join(wrong)


def test_every_module_of_a_floor_with_parts_is_in_one():
    """A floor with no "" row (swarm/) keeps nothing beside its parts but its `__init__`; a new
    module goes in the part of its concern, a new part gets a row in PARTS."""
    homeless = [
        name
        for name, path in package_modules()
        if part_of(name) == "" and "" not in PARTS[top(name)] and name != f"{NAMESPACE}.{top(name)}"
    ]
    unlisted = [
        f"{floor}/{path.relative_to(ROOT / floor).parent}"
        for floor in PARTS
        for path in sorted((ROOT / floor).glob("*/__init__.py"))
        if path.parent.name not in PARTS[floor]
    ]
    assert not homeless + unlisted, "\n".join(homeless + unlisted)


def test_the_parts_of_a_floor_stand_in_order():
    """PARTS itself has no circle between parts (a floor's own modules aside), so that the parts
    read bottom to top."""
    for floor, rows in PARTS.items():
        graph = {part: set(allowed) - {""} for part, allowed in rows.items() if part}
        assert not circles(graph), f"{floor}: {circles(graph)}"
        assert all(set(allowed) <= set(rows) for allowed in rows.values()), floor


def test_setup_cfg_installs_every_package_under_the_namespace():
    """A new sub-package is listed in setup.cfg, or an installed hexswarm would lack it."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    packages = {name for name, path in package_modules() if path.name == "__init__.py"}
    assert listed == packages | {NAMESPACE}
    mapped = dict(line.split(" = ") for line in config["options"]["package_dir"].strip().splitlines())
    assert mapped == {NAMESPACE: NAMESPACE, **{f"{NAMESPACE}.{folder}": folder for folder in FLOORS}}


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_modules_stay_under_the_line_limit():
    long = [
        f"{path.relative_to(ROOT)}: {lines_of(path)} lines"
        for name, path in package_modules()
        if name not in LONG_MODULES and lines_of(path) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by responsibility):\n" + "\n".join(long)


def test_each_long_module_listed_is_still_long():
    """Once a listed module is split, it leaves LONG_MODULES, so the list says what is left."""
    paths = dict(package_modules())
    stale = [name for name in LONG_MODULES if name not in paths or lines_of(paths[name]) <= MAX_MODULE_LINES]
    assert not stale, "no longer long, remove from LONG_MODULES: " + ", ".join(stale)
