"""Text that came from other peers, made safe to print on a terminal.

A peer chooses its own name, version, region and device names, and signs them: the signature
proves who wrote them, not that they are harmless. Printed raw, an ESC byte starts an ANSI
escape sequence that can recolour, clear or retitle the reader's terminal, move the cursor to
overwrite lines printed before it (a healthy-looking status table), or, on some terminals,
write to the clipboard. Unicode bidirectional controls can reorder what the reader sees.

`printable` shows every character that is not printable as Python's `repr` would (`\\x1b`,
`\\n`, `\\u202e`), so the text stays readable and nothing in it reaches the terminal as a
control, and cuts it to a length that fits a table column.
"""

from __future__ import annotations

ELLIPSIS = "…"
DEFAULT_LIMIT = 64  # characters: a long name must not push a table's other columns off screen


def printable(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as text with every non-printable character escaped, at most `limit` characters.

    A backslash is escaped too, so an escaped ESC (`\\x1b`) cannot be mistaken for a name
    that spells those four characters. A cut value ends with an ellipsis.
    """
    text = "".join(_shown(ch) for ch in str(value))
    if len(text) <= limit:
        return text
    return text[: max(limit - len(ELLIPSIS), 0)] + ELLIPSIS


def _shown(ch: str) -> str:
    if ch.isprintable() and ch != "\\":
        return ch
    return repr(ch)[1:-1]  # "'\\x1b'" -> "\\x1b"; repr escapes exactly the non-printable
