"""The chat page's response (client/api/chat_page.py) and what the API says about how an answer
was served (client/api/answer_report.py); the page itself runs in a browser in
tests/integration/test_real_model.py."""

from __future__ import annotations

import re

from hexswarm.client.api.answer_report import AnswerTiming, failover_summary, final_extension, live_extension
from hexswarm.client.api.chat_page import chat_page
from hexswarm.client.api.text import Finished
from hexswarm.client.peer_failures import Failover


def test_the_page_allows_only_its_own_script_and_style_with_a_fresh_nonce():
    first, second = chat_page(), chat_page()
    policy = first.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([\w-]+)'", policy).group(1)
    page = first.body.decode()
    assert page.count(f'nonce="{nonce}"') == 2 and "{{NONCE}}" not in page  # the <style> and the <script>
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert nonce not in second.headers["content-security-policy"]
    assert not re.search(r"""(src|href)=["']https?:""", page)  # no external asset
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page  # text only


def test_timing_counts_the_wait_to_the_first_token_and_the_decode_rate_after_it():
    timing = AnswerTiming(arrived=100.0)
    timing.first_token = 100.5
    assert timing.figures(tokens=11, ended=102.5) == {
        "time_to_first_token_s": 0.5,
        "tokens_per_s": 5.0,
        "tokens": 11,
    }
    assert timing.figures(tokens=1, ended=100.5)["tokens_per_s"] is None
    assert AnswerTiming(arrived=1.0).figures(tokens=0) == {}


def test_failovers_are_escaped_cut_and_counted():
    hostile = Failover("\x1b[31mevil", 3, 6, "UNREACHABLE: " + "x" * 1000, detected=10.0, recovered=10.25)
    (shown,) = failover_summary([hostile])
    assert shown["peer"].startswith("\\x1b") and len(shown["error"]) <= 240
    assert shown == {**shown, "blocks": "3:6", "recovered_s": 0.25}
    finished = Finished("stop", 4, route="a[0:3) -> b[3:6)", failovers=[hostile] * 20)
    extension = final_extension(finished, AnswerTiming(arrived=0.0, first_token=0.1))
    assert len(extension["failovers"]) == 16 and extension["failovers_total"] == 20
    assert extension["route"] == "a[0:3) -> b[3:6)" and extension["timing"]["tokens"] == 4
    assert live_extension(None) is None and live_extension("a[0:6)") == {"route": "a[0:6)"}
