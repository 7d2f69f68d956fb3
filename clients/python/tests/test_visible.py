"""Approval prompts show what runs (spec/sandbox.md H22): corral_client's visible_command and
visible_text, the same rules and output as the CLI's prompt (src/client/approve.rs)."""

from __future__ import annotations

import unicodedata

import corral_client
from corral_client._visible import SHOWN_CHARS, hidden, shell_words, visible_command, visible_text

# The red team's spoof: CR and "erase line" make a terminal show only the harmless tail.
SPOOF = "touch pwned\r\x1b[2K  $ ls -la"


def raw_hidden(text: str) -> list[str]:
    return [c for c in text if hidden(c) or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def test_the_spoof_is_shown_escaped():
    assert shell_words([SPOOF]) == r"$'touch pwned\r\x1b[2K  $ ls -la'"
    assert visible_command(["bash", "-c", SPOOF]) == r"bash -c $'touch pwned\r\x1b[2K  $ ls -la'"
    assert visible_text(SPOOF) == r"touch pwned\r\x1b[2K  $ ls -la"


def test_words_are_quoted_as_the_cli_quotes_them():
    assert visible_command(["ls", "-la", "a/b.txt", "k=v,w:x+y@z%"]) == "ls -la a/b.txt k=v,w:x+y@z%"
    assert visible_command(["echo", "", "two words", "it's"]) == r"echo '' 'two words' 'it'\''s'"
    # A word with a hidden character: $'…' with backslash and quote escaped too.
    assert visible_command(["echo", "a\u202eb\u200b'\\"]) == r"echo $'a\u202eb\u200b\'\\'"
    assert visible_command(["printf", "x\ty\n\x7f\x00"]) == r"printf $'x\ty\n\x7f\x00'"
    # Other non-ASCII text is shown as it is, quoted.
    assert visible_command(["echo", "héllo wörld"]) == "echo 'héllo wörld'"


def test_bidirectional_and_invisible_characters_are_escaped():
    justification = "harmless cleanup \u202e\u2066fr- mr\u2069 \ufeff\u00ad\u061c\u180e\u2028\u2060\u0085"
    shown = visible_text(justification)
    assert shown == (
        r"harmless cleanup \u202e\u2066fr- mr\u2069 \ufeff\u00ad\u061c\u180e\u2028\u2060\u0085"
    )
    assert not raw_hidden(shown)
    assert visible_text("line one\r\nline two") == r"line one\r\nline two"
    assert "\n" not in visible_text("a\nb\nc")
    # Every hidden range the CLI names, ends included; neighbours are not hidden.
    for start, end in [(0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x2069)]:
        assert all(hidden(chr(c)) for c in range(start, end + 1))
        assert not hidden(chr(start - 1)) and not hidden(chr(end + 1))
    assert all(hidden(chr(c)) for c in [*range(0x20), *range(0x7F, 0xA0)])
    assert not any(hidden(c) for c in "a é€ 漢 $'\\")


def test_long_text_is_cut_with_a_note():
    assert SHOWN_CHARS == 2000
    text = "z" * 5000
    assert visible_text(text) == "z" * 2000 + "… [3000 more characters not shown]"
    assert visible_text("z" * 2000) == "z" * 2000
    assert visible_text("\x1b" * 2001) == r"\x1b" * 2000 + "… [1 more characters not shown]"
    command = visible_command(["echo", "y" * 5000])
    assert command == "echo " + "y" * 1995 + "… [3005 more characters not shown]"
    assert visible_command(["a" * 1000, "b" * 999]) == "a" * 1000 + " " + "b" * 999


def test_the_helpers_are_part_of_the_package():
    assert corral_client.visible_command is visible_command
    assert corral_client.visible_text is visible_text
    assert {"visible_command", "visible_text"} <= set(corral_client.__all__)
