"""--quiet / --log-level on every command, the context on every log line, and hidden progress bars."""

import argparse
import logging
import subprocess
import sys

import pytest

from hexswarm.peer.cli import build_parser as run_peer_parser
from hexswarm.swarm.commands.cli import SUBCOMMANDS, main
from hexswarm.swarm.tools import log_setup


@pytest.fixture(autouse=True)
def _restore_logging():
    """setup_logging configures the whole process: put the root logger back after each test."""
    root = logging.getLogger()
    handlers, level, factory = root.handlers[:], root.level, logging.getLogRecordFactory()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.setLogRecordFactory(factory)
    log_setup.set_context("hexswarm")


def _args(*argv, default="info"):
    parser = argparse.ArgumentParser()
    log_setup.add_log_arguments(parser, default=default)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "argv, default, level",
    [
        ((), "info", logging.INFO),
        (("--quiet",), "info", logging.WARNING),
        (("--quiet", "--log-level", "debug"), "info", logging.DEBUG),  # an explicit level wins
        (("--log-level", "error"), "info", logging.ERROR),
        ((), "warning", logging.WARNING),  # the client's default
        (("-v",), "warning", logging.DEBUG),
        (("-v", "--log-level", "info"), "info", logging.INFO),  # an explicit level wins here too
    ],
)
def test_levels(argv, default, level):
    assert log_setup.log_level(_args(*argv, default=default)) == level


def test_lines_name_what_they_are_about_and_the_context_can_change(capsys):
    log_setup.setup_logging(_args(), "peer ? tiny-1234[0:4)")
    logging.getLogger("hexswarm.peer.test").info("loading")
    log_setup.set_context("peer alice tiny-1234[0:4)")  # the name is known after joining the DHT
    logging.getLogger("hexswarm.peer.test").info("online")
    logging.getLogger("hexswarm.peer.test").debug("not shown at info")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("INFO peer ? tiny-1234[0:4): loading")
    assert lines[1].endswith("INFO peer alice tiny-1234[0:4): online")
    assert len(lines) == 2


def test_quiet_keeps_warnings_and_hides_progress(capsys):
    log_setup.setup_logging(_args("--quiet"), "hexswarm plan")
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    with log_setup.progress(total=3, desc="planning") as bar:
        bar.update(3)
    assert not log_setup.progress_enabled()
    assert capsys.readouterr().err.strip().endswith("hexswarm plan: shown")  # WARNING (WARN under hivemind)


def test_no_bars_when_stderr_is_not_a_terminal(capsys):
    log_setup.setup_logging(_args(), "x")
    assert not sys.stderr.isatty() and not log_setup.progress_enabled()
    with log_setup.progress(total=2, desc="loading") as bar:
        bar.update(2)
    assert "loading" not in capsys.readouterr().err


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_hexswarm_command_takes_the_flags(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--quiet" in out and "--log-level" in out


def test_run_peer_and_the_client_take_the_flags():
    peer = [
        "m",
        "--layers",
        "0:1",
        "--initial-peers",
        "/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q",
    ]
    args = run_peer_parser().parse_args([*peer, "--quiet", "--log-level", "debug"])
    assert args.quiet and args.log_level == "debug"
    help_text = subprocess.run(
        [sys.executable, "-m", "hexswarm", "generate", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "--quiet" in help_text and "--log-level" in help_text and "--verbose" in help_text


def test_p2pd_closing_its_own_socket_is_not_logged_as_an_error(caplog):
    """p2pd's accept loop reports its own clean stop at ERROR; hexswarm's logs stay quiet about it."""
    import hivemind.p2p.p2p_daemon as p2p_daemon

    import hexswarm.swarm.net.dht_process  # noqa: F401 (installs the filter)

    line = (
        '{"level":"error","ts":"2026-11-28T02:00:00.000Z","logger":"p2pd","caller":"go-libp2p-daemon/daemon.go:198",'
        '"msg":"error accepting connection","error":"accept unix /tmp/x.sock: use of closed network connection"}'
    )
    other = line.replace("error accepting connection", "something else broke")
    with caplog.at_level(logging.DEBUG, logger="hivemind.p2p.p2p_daemon"):
        p2p_daemon.logger.addHandler(caplog.handler)  # hivemind's loggers do not propagate to the root
        try:
            p2p_daemon.P2P._log_p2pd_message(line)
            p2p_daemon.P2P._log_p2pd_message(other)
        finally:
            p2p_daemon.logger.removeHandler(caplog.handler)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("error accepting connection" in m for m in messages)
    assert any("something else broke" in m for m in messages)
