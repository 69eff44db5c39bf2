"""hexswarm.swarm.tools.terminal_text.printable: peer-supplied text shown without driving the terminal."""

import pytest

from hexswarm.swarm.tools.terminal_text import printable


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("alice", "alice"),
        ("José 東京", "José 東京"),  # printable non-ASCII text stays as it is
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("title\x1b]0;pwned\x07", "title\\x1b]0;pwned\\x07"),
        ("abc\u202edef", "abc\\u202edef"),  # a bidirectional override
        ("\x9b31m", "\\x9b31m"),  # the one-byte C1 form of ESC [
        ("back\\x1b", "back\\\\x1b"),  # a literal backslash cannot pass for an escape
    ],
)
def test_non_printable_characters_are_escaped(raw, shown):
    assert printable(raw) == shown


def test_long_values_are_cut_with_an_ellipsis():
    assert printable("x" * 100, 10) == "x" * 9 + "…"
    assert len(printable("\x1b" * 100, 16)) == 16


def test_non_text_values_are_shown_as_text():
    assert printable(42) == "42"
