"""Logging and progress bars for every command: `-v`, `--quiet`, `--log-level`, and who a line is about.

Every command (run-peer and each `hexswarm` subcommand) gets the flags from
`add_log_arguments` (through `swarm.commands.cli_args.new_parser`) and calls `setup_logging` once it
knows what it is about. Each log line then starts with that context, e.g. `peer alice
tiny-3f2a[0:4)`, so lines from many processes of one swarm can be told apart. A peer learns
its name only after joining the DHT and updates the context then (`set_context`).

Progress bars (tqdm) are drawn on stderr only when it is a terminal and `--quiet` is off:
logs redirected to a file never fill up with bar updates.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator

LEVELS = ("debug", "info", "warning", "error")
LOG_FORMAT = "%(asctime)s %(levelname)s %(context)s: %(message)s"

_context = "hexswarm"
_progress = True


_make_record = logging.getLogRecordFactory()


def _record_with_context(*args, **kwargs) -> logging.LogRecord:
    """Every record carries the current context (read when it is made, so it can change)."""
    record = _make_record(*args, **kwargs)
    record.context = _context
    return record


def add_log_arguments(parser: argparse.ArgumentParser, default: str = "info") -> None:
    """Adds -v, --quiet and --log-level; `default` is the level without them (the client's is warning)."""
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="store_true", help="the same as --log-level debug")
    group.add_argument(
        "-q", "--quiet", action="store_true", help="log only warnings and errors; no progress bars"
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default=None,
        help=f"log level (default: {default}{', or warning with --quiet' if default != 'warning' else ''}; "
        "debug with -v)",
    )
    parser.set_defaults(default_log_level=default)


def log_level(args: argparse.Namespace) -> int:
    """The level `--log-level` / `-v` / `--quiet` ask for (an explicit --log-level wins)."""
    name = getattr(args, "log_level", None)
    if name is None and getattr(args, "verbose", False):
        name = "debug"
    if name is None:
        name = "warning" if getattr(args, "quiet", False) else getattr(args, "default_log_level", "info")
    return getattr(logging, name.upper())


def setup_logging(args: argparse.Namespace, context: str) -> None:
    """Configures the root logger once per process, and whether progress bars are shown."""
    global _progress
    logging.setLogRecordFactory(_record_with_context)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, "%H:%M:%S"))
    level = log_level(args)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    set_context(context)
    _progress = not getattr(args, "quiet", False)
    if not progress_enabled():  # transformers' and huggingface_hub's own bars too (e.g. saving a checkpoint)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when they are imported
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    # hivemind logs every connection at INFO: only its warnings, unless asked for debug logs
    hivemind_level = "DEBUG" if level <= logging.DEBUG else "WARNING"
    os.environ.setdefault("HIVEMIND_LOGLEVEL", hivemind_level)  # read when hivemind is imported
    logging.getLogger("hivemind").setLevel(hivemind_level)


def set_context(context: str) -> None:
    """What the following log lines are about, e.g. `peer alice tiny-3f2a[0:4)`."""
    global _context
    _context = context


def context() -> str:
    return _context


def disable_progress() -> None:
    """No bars from this process (e.g. a tensor-parallel rank: its leader draws them)."""
    global _progress
    _progress = False


def progress_enabled() -> bool:
    return _progress and sys.stderr.isatty()


@contextlib.contextmanager
def progress(*, total: int, desc: str, unit: str = "it") -> Iterator:
    """A tqdm bar on stderr (`bar.update(n)`), or a silent stand-in when bars are off.

    While it is drawn, log lines are written above it instead of through it.
    """
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    shown = progress_enabled()
    with tqdm(total=total, desc=desc, unit=unit, disable=not shown, leave=False, file=sys.stderr) as bar:
        with logging_redirect_tqdm() if shown else contextlib.nullcontext():
            yield bar
