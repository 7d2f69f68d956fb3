"""Model text as an approval prompt must show it (spec/sandbox.md H22: what a person approves is
what runs). The same rules and output as the CLI's prompt (src/client/approve.rs): control
characters, escape sequences and invisible or direction-changing characters are written as
escapes, so the text stays on one line and reads as what runs; each field is cut at
:data:`SHOWN_CHARS` with a note.

    visible_command(["bash", "-c", "touch pwned\\r\\x1b[2K  $ ls -la"])
    # bash -c $'touch pwned\\r\\x1b[2K  $ ls -la'
    visible_text("fine\\u202eok")  # fine\\u202eok, escaped
"""

from __future__ import annotations

import unicodedata
from typing import Iterable

__all__ = ["SHOWN_CHARS", "hidden", "shell_words", "visible_command", "visible_text"]

#: The most of one field (a command, a reason) a prompt shows; the rest is cut with a note.
SHOWN_CHARS = 2000

_INVISIBLE = frozenset(
    [0x00AD, 0x061C, 0x180E, 0xFEFF]
    + list(range(0x200B, 0x200F + 1))
    + list(range(0x2028, 0x202E + 1))
    + list(range(0x2060, 0x2064 + 1))
    + list(range(0x2066, 0x2069 + 1))
)

# shlex.quote's safe characters: these words are shown as they are.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%")


def hidden(c: str) -> bool:
    """Whether the character ``c`` must not reach the user as itself: control characters (an
    escape sequence starts with one, CR rewrites the line) and the invisible or
    direction-changing characters that make text read differently from what runs."""
    return unicodedata.category(c) == "Cc" or ord(c) in _INVISIBLE


def _escaped(c: str) -> str:
    """``c`` as bash's ``$'…'`` writes it: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if c == "\n":
        return "\\n"
    if c == "\r":
        return "\\r"
    if c == "\t":
        return "\\t"
    code = ord(c)
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def _cut(text: str, limit: int) -> str:
    if len(text) > limit:
        return f"{text[:limit]}… [{len(text) - limit} more characters not shown]"
    return text


def visible_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """Model text (a reason, a justification, a directory) for a prompt: hidden characters
    escaped, so it is one line, and at most ``limit`` characters of it with a note saying how
    many more there are."""
    shown = text[:limit]
    out = "".join(_escaped(c) if hidden(c) else c for c in shown)
    if len(text) > limit:
        out += f"… [{len(text) - limit} more characters not shown]"
    return out


def shell_words(argv: Iterable[str]) -> str:
    """The argv as a shell would read it, in full: words of safe characters as they are, a word
    with a hidden character as ``$'…'`` with escapes (``\\\\`` and ``\\'`` too), any other word
    single-quoted (``'\\''`` for a quote in it)."""
    words = []
    for a in argv:
        if a and all(c in _PLAIN for c in a):
            words.append(a)
        elif any(hidden(c) for c in a):
            body = "".join(
                "\\\\" if c == "\\" else "\\'" if c == "'" else _escaped(c) if hidden(c) else c for c in a
            )
            words.append(f"$'{body}'")
        else:
            words.append("'" + a.replace("'", "'\\''") + "'")
    return " ".join(words)


def visible_command(argv: Iterable[str], limit: int = SHOWN_CHARS) -> str:
    """The argv for a prompt: :func:`shell_words`, cut at ``limit`` characters with a note."""
    return _cut(shell_words(argv), limit)
