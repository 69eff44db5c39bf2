"""The chat page `hexswarm api` serves at `/` (client/api/chat_page.html): one HTML file, no
external assets, talking to the API's own `/v1/chat/completions` stream.

Model output and peer names are untrusted text: the page builds its DOM with `textContent`
only, and this response's Content-Security-Policy allows no script or style but the page's own
(a fresh nonce per response), no connection but to this server and no image from elsewhere, so
even a rendering mistake could not run or load what an answer contains.
"""

from __future__ import annotations

import secrets
from functools import cache
from importlib import resources

from fastapi.responses import HTMLResponse

NONCE_MARK = "{{NONCE}}"


@cache
def _template() -> str:
    return resources.files("hexswarm.client.api").joinpath("chat_page.html").read_text(encoding="utf-8")


def chat_page() -> HTMLResponse:
    """The page, with its script and style allowed by a nonce of this response only."""
    nonce = secrets.token_urlsafe(16)
    policy = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }
    return HTMLResponse(_template().replace(NONCE_MARK, nonce), headers=headers)
