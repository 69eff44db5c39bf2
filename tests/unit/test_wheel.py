"""The wheel a user installs (`pip install .`, the Docker images): every module of the four
folders lands under `hexswarm/`, with the monitor's and the chat page's HTML, and nothing at the top level but
`hexswarm` itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("swarm", "peer", "client", "routing")
PACKAGED = {*FOLDERS, "hexswarm", "setup.cfg", "pyproject.toml", "README.md"}


def _not_packaged(folder: str, names: list[str]) -> list[str]:
    """copytree's filter: at the checkout's root, everything a wheel is not built from."""
    top = Path(folder) == ROOT
    return [n for n in names if (top and n not in PACKAGED) or n == "__pycache__" or n.endswith(".egg-info")]


def test_the_wheel_installs_everything_under_one_name(tmp_path):
    source = tmp_path / "source"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(ROOT, source, ignore=_not_packaged)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("hexswarm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"hexswarm/{path.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
    }
    assert expected <= names, sorted(expected - names)[:10]
    assert "hexswarm/client/monitor_page.html" in names and "hexswarm/client/api/chat_page.html" in names
    assert "hexswarm/swarm/net/public_peers.txt" in names  # --public reads the bootstrap list
    tops = {name.split("/")[0] for name in names if not name.startswith("hexswarm-")}
    assert tops == {"hexswarm"}
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert (
        "run-peer = hexswarm.peer.cli:main" in text and "hexswarm = hexswarm.swarm.commands.cli:main" in text
    )
