"""The floors of hexswarm's imports, read from the code itself (`ast`), so the layering that
docs/architecture.md#folder-layout describes stays true.

Bottom to top: `routing/` (pure solvers) -> `swarm/` (what every role shares) -> `peer/` and
`client/` (the roles, which never import each other) -> the commands. A command lives in the
package of the role it runs, so the commands are a floor of modules rather than a folder: no
other module imports one. The `hexswarm` dispatcher (swarm/cli.py) sits above everything: it
names every command's module in its table and imports it only when that verb runs.

Every import counts: at module level, inside a function, and `importlib.import_module` with a
literal name.
"""

from __future__ import annotations

import ast
import configparser
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> floor; a module may import from its own floor and the ones below
FLOORS = {"routing": 0, "swarm": 1, "peer": 2, "client": 2}
ROLES = ("peer", "client")
DISPATCHER = "swarm.cli"


def module_name(path: Path) -> str:
    """`swarm/coordinator/command.py` -> `swarm.coordinator.command` (a package is its `__init__`)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The absolute names of every module `path` imports, anywhere in the file. `from a import b`
    gives `a`, and `a.b` too where `b` is one of this project's modules; relative imports are
    resolved."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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


def _absolute(path: Path, level: int, module: str | None) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `path`."""
    if not level:
        return module or ""
    package = module_name(path).split(".")[: -1 if path.name != "__init__.py" else None]
    return ".".join([*package[: len(package) - level + 1], *([module] if module else [])])


def _is_ours(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def package_modules() -> Iterator[tuple[str, Path]]:
    """(module name, path) of every module in the four packages."""
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield module_name(path), path


def top(name: str) -> str:
    return name.split(".")[0]


def dispatched_modules() -> dict[str, str]:
    """The dispatcher's table, read without importing it: verb -> command module."""
    tree = ast.parse((ROOT / "swarm" / "cli.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SUBCOMMANDS":
            return {verb: module for verb, (module, _) in ast.literal_eval(node.value).items()}
    raise AssertionError("swarm/cli.py has no SUBCOMMANDS table")


def command_modules() -> set[str]:
    """Every module that is a command: the dispatcher's verbs, the console scripts, `__main__`s."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"].strip().splitlines()
    commands = set(dispatched_modules().values())
    commands.update(line.split("=")[1].strip().split(":")[0] for line in scripts)
    commands.update(name for name, path in package_modules() if path.name == "__main__.py")
    return commands


def test_imports_of_reads_every_kind_of_import(tmp_path):
    path = tmp_path / "example.py"
    path.write_text(
        "import os.path\n"
        "from swarm import records\n"
        "def later():\n"
        "    from client.swarm_client import SwarmClient\n"
        "    importlib.import_module('peer.cli')\n"
    )
    assert imports_of(path) == {"os.path", "swarm", "swarm.records", "client.swarm_client", "peer.cli"}


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
        for imported in imports_of(ROOT / "swarm" / "cli.py")
        if top(imported) in FLOORS and FLOORS[top(imported)] > FLOORS["swarm"]
    ]
    assert not upward


@pytest.mark.parametrize("verb,module", sorted(dispatched_modules().items()))
def test_each_verb_names_a_command_module_of_a_package(verb, module):
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    assert top(module) in FLOORS and path.is_file(), f"hexswarm {verb}: no module {module}"
    defined = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
    assert {"add_arguments", "run"} <= defined, f"hexswarm {verb}: {module} is not a command"
