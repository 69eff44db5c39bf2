"""Takes the README's monitor screenshot (docs/monitor.png) of a real local swarm.

The demo's swarm (a tiny 8-layer Llama; alice 0:4, bob 2:8, carol 4:8) plus a second model
whose only peer for its upper half has left, two streams in flight through `hexswarm api` so
that sessions show, and `hexswarm monitor`, photographed in headless Chromium. Run:

    python scripts/monitor_screenshot.py [--out docs/monitor.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from headless_browser import start_browser

from hexswarm.swarm.commands.tiny_model import make_tiny_model
from hexswarm.swarm.tools.launcher import LocalSwarm, free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/monitor.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hexswarm-shot-") as tmp:
        tmp = Path(tmp)
        demo = make_tiny_model(tmp / "tiny-llama", layers=8, seed=0)
        small = make_tiny_model(tmp / "tiny-qwen2", arch="qwen2", layers=4, hidden=128, heads=4, kv_heads=2)
        with LocalSwarm(tmp / "logs", env={"HEXSWARM_CACHE_DIR": str(tmp / "cache")}) as swarm:
            swarm.start_bootstrap()
            peers = [
                swarm.start_peer(demo, r, n, "--announce-period", "1", wait=False)
                for n, r in (("alice", "0:4"), ("bob", "2:8"), ("carol", "4:8"))
            ]
            peers += [
                swarm.start_peer(small, r, n, "--announce-period", "1", wait=False)
                for n, r in (("dave", "0:2"), ("erin", "2:4"))
            ]
            for proc in peers:
                swarm.wait_for_log(proc, "online:", timeout=300)
            swarm.stop(peers[-1])  # erin leaves: blocks 2:4 of the second model go missing
            api_port, monitor_port = free_port(), free_port()
            swarm.start_command(
                "api",
                [
                    sys.executable,
                    "-m",
                    "hexswarm.swarm.commands.cli",
                    "api",
                    "--initial-peers",
                    *swarm.initial_peers,
                    "--model",
                    str(demo),
                    "--port",
                    str(api_port),
                ],
                ready="api: serving",
                timeout=300,
            )
            swarm.start_command(
                "monitor",
                [
                    sys.executable,
                    "-m",
                    "hexswarm.swarm.commands.cli",
                    "monitor",
                    "--initial-peers",
                    *swarm.initial_peers,
                    "--port",
                    str(monitor_port),
                    "--refresh",
                    "1",
                ],
                ready="monitor: http",
                timeout=300,
            )
            streams = [threading.Thread(target=_stream, args=(api_port,), daemon=True) for _ in range(2)]
            for thread in streams:
                thread.start()
            time.sleep(6)  # sessions announced, snapshot refreshed
            browser = start_browser(1400, 900)
            try:
                browser.get(f"http://127.0.0.1:{monitor_port}/")
                deadline = time.monotonic() + 60
                while len(browser.find_elements("css selector", "section[data-model]")) < 2:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the monitor never showed both models")
                    time.sleep(0.5)
                time.sleep(2)
                height = browser.execute_script("return document.documentElement.scrollHeight")
                browser.execute_cdp_cmd(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": 1400, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                args.out.parent.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(str(args.out))
            finally:
                browser.quit()
    print(args.out)


def _stream(port: int) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=5)
    try:
        for _ in client.completions.create(
            model="tiny-llama", prompt="A swarm", max_tokens=1800, stream=True
        ):
            pass
    except Exception:  # the swarm is torn down under it at the end
        pass


if __name__ == "__main__":
    main()
