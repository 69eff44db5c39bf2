"""Takes the README's chat page screenshot (docs/chat.png) of a real local swarm.

The demo's swarm (SmolLM2-135M-Instruct; alice 0:12, bob 10:22, carol 20:30), `hexswarm api`,
and its chat page in headless Chromium, after two questions answered greedily. Run:

    python scripts/chat_screenshot.py [--out docs/chat.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from headless_browser import start_browser

from hexswarm.swarm.commands.demo import REAL_RANGES
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import LocalSwarm, free_port

QUESTIONS = ("What is the capital of France?", "Name three famous French painters.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/chat.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hexswarm-shot-") as tmp:
        with LocalSwarm(Path(tmp) / "logs") as swarm:
            swarm.start_bootstrap()
            peers = [
                swarm.start_peer(DEFAULT_MODEL, r, n, "--announce-period", "1", wait=False)
                for n, r in REAL_RANGES
            ]
            for proc in peers:
                swarm.wait_for_log(proc, "online:", timeout=300)
            port = free_port()
            swarm.start_command(
                "api",
                [sys.executable, "-m", "hexswarm.swarm.commands.cli", "api", "--initial-peers", *swarm.initial_peers,
                 "--model", DEFAULT_MODEL, "--port", str(port)],
                ready="api: serving",
                timeout=300,
            )  # fmt: skip
            _photograph(f"http://127.0.0.1:{port}/", args.out)
    print(args.out)


def _photograph(url: str, out: Path) -> None:
    from selenium.webdriver.common.keys import Keys

    browser = start_browser(1000, 760)
    try:
        browser.get(url)
        for question in QUESTIONS:
            browser.find_element("id", "input").send_keys(question + Keys.ENTER)
            _wait_until_answered(browser)
        out.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(out))
    finally:
        browser.quit()


def _wait_until_answered(browser, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    time.sleep(0.5)
    while browser.execute_script("return document.querySelector('.turn[data-state=\"streaming\"]') !== null"):
        if time.monotonic() > deadline:
            raise RuntimeError("the answer did not end in time")
        time.sleep(0.3)


if __name__ == "__main__":
    main()
