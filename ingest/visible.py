"""Names made safe to print: control characters shown as escapes.

File names come from uploads and archives, so they can hold ANSI escape
sequences, carriage returns or bidi overrides that rewrite a terminal line
(or fake a status line) and newlines that fake a header in the context.
visible() keeps every printable character and replaces the rest with a
Python-style escape ('\\x1b', '\\r', '\\n', '\\u202e'), so what is printed
is unambiguous and stays on one line.
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Invisible characters that reorder or hide text; not 'C*' categories everywhere.
_FORMAT_EXTRA = {"\u2028", "\u2029"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """`text` with control, format (bidi, zero-width) and separator characters escaped."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch == " " or (ch.isprintable() and ch not in _FORMAT_EXTRA
                         and unicodedata.category(ch) not in ("Cf", "Cc", "Zl", "Zp", "Co", "Cs", "Cn")):
            out.append(ch)
        else:
            out.append(_escape(ch))
    return "".join(out)
