"""Bytes -> clean text for plain text, Markdown and source code.

Real files are not always UTF-8: detect the encoding (charset-normalizer),
fall back to UTF-8 with replacement characters and say so.  Binary files are
recognised by content, not only by name.  Newlines are normalised to '\\n'
without changing line numbers, and absurdly long lines are cut so one
minified file cannot dominate the context.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
_SNIFF_BYTES = 8192
# Control bytes other than \t \n \f \r and ESC: frequent in binaries, rare in text.
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 12, 13, 27)) + b"\x7f"


@dataclass
class DecodedText:
    """Decoded, normalised text plus notes for the file report."""

    text: str
    encoding: str
    replaced_chars: int = 0
    truncated_lines: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def lossy(self) -> bool:
        return self.replaced_chars > 0 or self.truncated_lines > 0


def bom_encoding(data: bytes) -> str | None:
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    return None


def looks_binary(data: bytes) -> bool:
    """True for content that is not text: NUL bytes or many control bytes."""
    if bom_encoding(data) in ("utf-16", "utf-32"):
        return False
    head = data[:_SNIFF_BYTES]
    if not head:
        return False
    if b"\x00" in head:
        return True
    controls = sum(head.count(bytes([c])) for c in _CONTROL)
    return controls / len(head) > 0.10


def _decode(data: bytes) -> tuple[str, str, int, str]:
    """(text, encoding, replacement count, note)."""
    bom = bom_encoding(data)
    if bom:
        text = data.decode(bom, errors="replace")
        return text, bom, text.count("\ufffd"), ""
    try:
        return data.decode("utf-8"), "utf-8", 0, ""
    except UnicodeDecodeError:
        pass
    lenient = data.decode("utf-8", errors="replace")
    replaced = lenient.count("\ufffd")
    valid_non_ascii = sum(1 for ch in lenient if ord(ch) > 127) - replaced
    if valid_non_ascii >= replaced:  # UTF-8 with a few damaged bytes: guessing would mangle the rest
        return lenient, "utf-8", replaced, f"invalid UTF-8; {replaced} damaged bytes replaced"
    encoding = _detect_encoding(data)
    if encoding:
        text = data.decode(encoding, errors="replace")
        return text, encoding, text.count("\ufffd"), f"not UTF-8; decoded as {encoding} (detected)"
    return lenient, "utf-8", replaced, f"not valid UTF-8 and the encoding is unknown; {replaced} bytes replaced"


# Non-ASCII characters common in Western European text (cp1252 / Latin-1).
_WESTERN = set("àâäáãåæçèéêëìíîïñòóôöõøùúûüýÿœßÀÂÄÁÃÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÖÕØÙÚÛÜÝŒ€£¥©®°±µ·«»¡¿“”‘’„–—…•™\xa0")


def _western_share(text: str) -> float:
    """Share of non-ASCII characters that are common Western ones; 0 when
    accented letters are not a minority of letters (Cyrillic or Greek read as
    cp1252 is all accented letters)."""
    non_ascii = [ch for ch in text if ord(ch) > 127]
    if not non_ascii:
        return 0.0
    letters = sum(1 for ch in text if ch.isalpha())
    if sum(1 for ch in non_ascii if ch.isalpha()) > 0.25 * letters:
        return 0.0
    return sum(ch in _WESTERN for ch in non_ascii) / len(non_ascii)


def _detect_encoding(data: bytes) -> str | None:
    """charset-normalizer's guess, overruled by cp1252 when that reads clearly better.

    Windows-1252 is the most common non-UTF-8 encoding of notes and source
    files, and the detector often prefers a look-alike code page (mac_latin2
    turns 'café' into 'cafť').  cp1252 wins only when nearly all its non-ASCII
    characters are ordinary Western letters and punctuation, they are a
    minority of the letters, and the detector's reading has fewer of them;
    Cyrillic or Greek stay with the detector.
    """
    from charset_normalizer import from_bytes  # lazy: only non-UTF-8 files pay

    best = from_bytes(data).best()
    guess = None
    if best is not None:
        try:
            guess = codecs.lookup(best.encoding).name
        except LookupError:
            guess = None
    try:
        western = _western_share(data.decode("cp1252"))
    except UnicodeDecodeError:
        western = 0.0
    if western >= 0.9 and (guess is None or _western_share(data.decode(guess, errors="replace")) < western):
        return "cp1252"
    return guess


def _cut_long_lines(text: str, max_line_chars: int) -> tuple[str, int]:
    if max_line_chars <= 0 or len(text) <= max_line_chars:
        return text, 0
    lines = text.split("\n")
    cut = 0
    for i, line in enumerate(lines):
        if len(line) > max_line_chars:
            lines[i] = f"{line[:max_line_chars]} [... line cut: {len(line)} characters]"
            cut += 1
    return ("\n".join(lines), cut) if cut else (text, 0)


def decode_text(data: bytes, *, max_line_chars: int) -> DecodedText:
    """Decode bytes of a text file and normalise it for the context."""
    text, encoding, replaced, note = _decode(data)
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\x00", "")
    text, cut = _cut_long_lines(text, max_line_chars)
    result = DecodedText(text=text, encoding=encoding, replaced_chars=replaced, truncated_lines=cut)
    if note:
        result.notes.append(note)
    elif replaced:
        result.notes.append(f"{replaced} undecodable characters replaced")
    if cut:
        result.notes.append(f"{cut} line{'s' if cut > 1 else ''} longer than {max_line_chars} characters cut")
    return result
