"""`hexswarm demo` leaves nothing behind, whatever signal ends it (its `--chat` page mode too).

The real demo (`--tiny`) runs as a subprocess with its temporary folder under this test's own
TMPDIR. The test watches every process the demo starts (its peers, their DHT processes and
p2p daemons, the client) and sends the demo one signal: SIGTERM (a service manager, `kill`)
or SIGHUP (its terminal closed), once the swarm serves and the client runs, or while the peers
are still starting. The demo must exit with 128 + the signal's number, no process it started
may outlive it, and its temporary folder must be gone.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psutil  # installed with accelerate, a dependency of hexswarm
import pytest

from hexswarm.swarm.tools.launcher import free_port

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 240  # three peers loading on a loaded 2-core machine
STOP_TIMEOUT_S = 120  # the demo's own cleanup: each stop is bounded (launcher.LocalSwarm.stop)
LEFTOVER_GRACE_S = 10  # a SIGKILLed process may take a moment to leave the process table


class Demo:
    """The demo process, its output (read on a thread) and every descendant seen so far."""

    def __init__(self, tmp_path, chat_port: int | None = None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
        command = [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "demo",
            "--tiny",
            "--max-new-tokens",
            "16",
        ]
        if chat_port is not None:
            command += ["--chat", "--port", str(chat_port)]
        self.popen = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        self.process = psutil.Process(self.popen.pid)
        self.lines: list[str] = []
        self.seen: dict[int, psutil.Process] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.popen.stdout:
            self.lines.append(raw.decode(errors="replace"))

    def output(self) -> str:
        return "".join(self.lines)

    def watch(self) -> list[psutil.Process]:
        """Records the demo's descendants now (a process once seen stays on the list)."""
        try:
            for child in self.process.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def wait_until(self, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.watch()
            if self.popen.poll() is not None:
                pytest.fail(f"the demo exited with {self.popen.returncode} first:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the demo was not ready within {timeout} s:\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def running_module(self, module: str, verb: str | None = None) -> int:
        """How many of the demo's own children run `python -m <module> [<verb>]` now (their
        forked DHT processes carry the same command line, and are not counted)."""
        self.watch()
        try:
            children = self.process.children()
        except psutil.NoSuchProcess:
            return 0
        return sum(_runs_module(p, module, verb) for p in running(children))

    def wait_for_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            self.watch()  # what it starts or leaves while stopping counts too
            time.sleep(0.05)
        return self.popen.wait(timeout=1)

    def kill_all(self) -> None:
        """Whatever the assertions found, nothing of ours is left running (killed by pid)."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        for proc in running(list(self.seen.values())):
            proc.kill()


def _runs_module(proc: psutil.Process, module: str, verb: str | None = None) -> bool:
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    return any(
        a == "-m" and b == module and verb in (None, c)
        for a, b, c in zip(cmdline, cmdline[1:], [*cmdline[2:], None], strict=False)
    )


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of `procs` that still run (a zombie has exited; pid reuse is ruled out by psutil)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            out.append(str(proc.pid))
    return "\n".join(out)


@pytest.mark.parametrize(
    "sig, when",
    [(signal.SIGTERM, "serving"), (signal.SIGHUP, "serving the chat page"), (signal.SIGTERM, "starting")],
    ids=["sigterm-while-serving", "sighup-while-serving-the-chat-page", "sigterm-while-peers-start"],
)
def test_demo_stops_everything_and_removes_its_folder_on_a_signal(tmp_path, sig, when):
    port = free_port()
    demo = Demo(tmp_path, chat_port=port if when == "serving the chat page" else None)
    try:
        if when == "serving the chat page":  # the swarm stays up while the page answers
            demo.wait_until(lambda: f"chat page: http://127.0.0.1:{port}/" in demo.output(), START_TIMEOUT_S)
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
            assert "<title>hexswarm chat</title>" in page
            answer = ask_the_api(port)
            assert answer["choices"][0]["message"]["content"] and answer["hexswarm"]["route"].startswith(
                "alice["
            )
        elif when == "serving":  # every peer online, and the client generating through them
            demo.wait_until(
                lambda: (
                    "swarm up" in demo.output()
                    and demo.running_module("hexswarm.swarm.commands.cli", "generate")
                ),
                START_TIMEOUT_S,
            )
        else:  # the bootstrap node up, the peers loading
            demo.wait_until(lambda: demo.running_module("hexswarm.peer.cli") == 3, START_TIMEOUT_S)
        assert (
            "[demo] bootstrap:" in demo.output()
            and demo.running_module("hexswarm.swarm.commands.cli", "bootstrap") == 1
        )
        demo.popen.send_signal(sig)

        code = demo.wait_for_exit(STOP_TIMEOUT_S)
        assert code == 128 + sig, demo.output()[-3000:]
        assert f"stopped by {signal.Signals(sig).name}" in demo.output()

        leftovers = running(demo.watch())
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.2)
            leftovers = running(leftovers)
        assert not leftovers, describe(leftovers)
        assert not list(tmp_path.glob("hexswarm-demo-*")), list(tmp_path.iterdir())
    finally:
        demo.kill_all()


def ask_the_api(port: int) -> dict:
    """One chat completion from the demo's API, as the page would ask it (not streamed here)."""
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=60).read())
