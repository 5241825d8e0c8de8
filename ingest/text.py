"""Bytes -> clean text for plain text, Markdown and source code.

Real files are not always UTF-8: detect the encoding (charset-normalizer,
corrected for cp1252 and for Japanese Shift-JIS/EUC-JP, which it often
reads as GB18030), say when the guess is uncertain (the report then reads
'encoding guessed as X (uncertain: ...)' and the file is 'partial'), and
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
    uncertain: bool = False  # the encoding is a guess the detector was not sure of

    @property
    def lossy(self) -> bool:
        """True when the text may differ from what the file says (report status 'partial')."""
        return self.replaced_chars > 0 or self.truncated_lines > 0 or self.uncertain


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


def _decode(data: bytes, declared: str | None = None) -> tuple[str, str, int, str, bool]:
    """(text, encoding, replacement count, note, uncertain)."""
    bom = bom_encoding(data)
    if bom:
        text = data.decode(bom, errors="replace")
        return text, bom, text.count("\ufffd"), "", False
    try:
        return data.decode("utf-8"), "utf-8", 0, "", False
    except UnicodeDecodeError:
        pass
    name = _declared_codec(declared) if declared else None
    if name:
        try:
            return data.decode(name), name, 0, f"not UTF-8; decoded as {name} (declared in the file)", False
        except UnicodeError:  # the declaration is wrong: detect instead
            pass
    lenient = data.decode("utf-8", errors="replace")
    replaced = lenient.count("\ufffd")
    valid_non_ascii = sum(1 for ch in lenient if ord(ch) > 127) - replaced
    if valid_non_ascii >= replaced and not _japanese_reading(data):
        # UTF-8 with a few damaged bytes: guessing would mangle the rest
        return lenient, "utf-8", replaced, f"invalid UTF-8; {replaced} damaged bytes replaced", False
    guess = _detect_encoding(data)
    if guess.encoding:
        text = data.decode(guess.encoding, errors="replace")
        if guess.doubt:
            note = f"not UTF-8; encoding guessed as {guess.encoding} (uncertain: {guess.doubt})"
        else:
            note = f"not UTF-8; decoded as {guess.encoding} (detected)"
        return text, guess.encoding, text.count("\ufffd"), note, bool(guess.doubt)
    return (lenient, "utf-8", replaced, f"not valid UTF-8 and the encoding is unknown; {replaced} bytes replaced",
            False)


# Printable ASCII and the ASCII escapes of transforms ('\\n', '+AGE-', '~{'): a file's own charset reads it unchanged.
_ASCII_PROBE = bytes(range(0x20, 0x7F)) + b"\t\n\r \\n\\x41\\u0041 +AGEA- ~{x~} .xn--caf-dma."


def _declared_codec(declared: str) -> str | None:
    """The codec of an encoding a file declares itself in, when it can be one.

    The declaration is ASCII inside the file, so only an encoding that
    reads ASCII as ASCII can be true; that rules out UTF-16/32, EBCDIC and
    transforms that are not charsets (unicode_escape, punycode, idna,
    base64, 'undefined' ...), which would turn the bytes into garbage or
    fail with errors other than UnicodeDecodeError.
    """
    try:
        name = codecs.lookup(declared).name
        return name if _ASCII_PROBE.decode(name) == _ASCII_PROBE.decode("ascii") else None
    except (LookupError, UnicodeError):
        return None


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


# Legacy CJK encodings by the language they write: different families are real alternatives.
_CJK_FAMILIES = {
    "ja": {"cp932", "shift_jis", "shift_jis_2004", "shift_jisx0213", "euc_jp", "euc_jis_2004", "euc_jisx0213",
           "iso2022_jp", "iso2022_jp_1", "iso2022_jp_2", "iso2022_jp_2004", "iso2022_jp_3", "iso2022_jp_ext"},
    "zh-hans": {"gb2312", "gbk", "gb18030", "hz"},
    "zh-hant": {"big5", "big5hkscs", "cp950"},
    "ko": {"euc_kr", "cp949", "johab", "iso2022_kr"},
}
_FAMILY_OF = {enc: fam for fam, encs in _CJK_FAMILIES.items() for enc in encs}
# A detector reading this chaotic (charset-normalizer's mess ratio, 0..1) is a guess.
_CHAOS_DOUBT = 0.15
# Another CJK family this close to the best reading is a real alternative.
_CJK_MARGIN = 0.05


@dataclass
class _Guess:
    encoding: str | None
    doubt: str = ""  # why the guess is uncertain ('' when confident)


def _codec(name: str) -> str | None:
    try:
        return codecs.lookup(name).name.replace("-", "_")
    except LookupError:
        return None


def _japanese_reading(data: bytes) -> str | None:
    """'cp932' or 'euc_jp' when exactly one of them reads `data` as Japanese.

    Japanese prose always has kana (hiragana particles, katakana words);
    Shift-JIS read as GB18030, or EUC-JP read as Shift-JIS, gives rare
    ideographs and half-width katakana instead.  A reading counts when it
    decodes without error, kana are at least 15% of its non-ASCII
    characters, half-width katakana at most 20%, and no private-use
    characters appear.
    """
    found = []
    for encoding in ("cp932", "euc_jp"):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        non_ascii = [ch for ch in text if ord(ch) > 127]
        if not non_ascii:
            continue
        kana = sum(1 for ch in non_ascii if "\u3041" <= ch <= "\u30ff")
        halfwidth = sum(1 for ch in non_ascii if "\uff61" <= ch <= "\uff9f")
        private = any("\ue000" <= ch <= "\uf8ff" for ch in non_ascii)
        if kana >= 0.15 * len(non_ascii) and halfwidth <= 0.2 * len(non_ascii) and not private:
            found.append(encoding)
    return found[0] if len(found) == 1 else None


def _detect_encoding(data: bytes) -> _Guess:
    """charset-normalizer's guess, corrected where it is known to go wrong, with a doubt when unsure.

    Windows-1252 is the most common non-UTF-8 encoding of notes and source
    files, and the detector often prefers a look-alike code page (mac_latin2
    turns 'café' into 'cafť').  cp1252 wins only when nearly all its non-ASCII
    characters are ordinary Western letters and punctuation, they are a
    minority of the letters, and the detector's reading has fewer of them;
    Cyrillic or Greek stay with the detector.

    Japanese text in Shift-JIS (cp932) or EUC-JP is often read as GB18030
    or not recognised at all; a reading full of kana settles it (see
    _japanese_reading).  Otherwise the guess is marked uncertain when the
    detector's best reading is chaotic, when a different CJK family reads
    the bytes nearly as well, or when a Japanese guess shows no kana.
    BOM-less UTF-16/32 guesses are dropped: such files contain NUL bytes and
    were classified as binary before decoding.
    """
    readings = _detector_readings(data)
    guess, chaos = readings[0] if readings else (None, 1.0)
    if _cp1252_reads_better(data, guess):
        return _Guess("cp1252")
    japanese = _japanese_reading(data)
    if japanese:
        return _Guess(japanese)
    if guess is None:
        return _Guess(None)
    return _Guess(guess, _doubt(guess, chaos, readings[1:]))


def _detector_readings(data: bytes) -> list[tuple[str, float]]:
    """charset-normalizer's (codec name, chaos) readings, best first, BOM-less UTF-16/32 left out."""
    from charset_normalizer import from_bytes  # lazy: only non-UTF-8 files pay

    readings = []
    for match in from_bytes(data):
        name = _codec(match.encoding)
        if name and not name.startswith(("utf_16", "utf_32")):
            readings.append((name, match.chaos))
    return readings


def _cp1252_reads_better(data: bytes, guess: str | None) -> bool:
    """True when cp1252 reads `data` as ordinary Western text, more so than the detector's guess."""
    try:
        western = _western_share(data.decode("cp1252"))
    except UnicodeDecodeError:
        western = 0.0
    return western >= 0.9 and (guess is None or _western_share(data.decode(guess, errors="replace")) < western)


def _doubt(guess: str, chaos: float, others: list[tuple[str, float]]) -> str:
    """Why the detector's guess is uncertain ('' when it is not); `others` are its runner-up readings."""
    family = _FAMILY_OF.get(guess)
    if family == "ja":
        return "this Japanese reading has few kana"
    rivals = _cjk_rivals(family, chaos, others) if family else []
    if rivals:
        return f"could also be {' or '.join(rivals[:3])}"
    if chaos >= _CHAOS_DOUBT:
        return "the text reads poorly in every encoding tried"
    return ""


def _cjk_rivals(family: str, chaos: float, others: list[tuple[str, float]]) -> list[str]:
    """Encodings of other CJK families that read the bytes nearly as well as the guess (of `family`)."""
    rivals = []
    for name, other_chaos in others:
        other = _FAMILY_OF.get(name)
        if other and other != family and other_chaos <= chaos + _CJK_MARGIN and name not in rivals:
            rivals.append(name)
    return rivals


def cut_long_lines(text: str, max_line_chars: int) -> tuple[str, int]:
    if max_line_chars <= 0 or len(text) <= max_line_chars:
        return text, 0
    lines = text.split("\n")
    cut = 0
    for i, line in enumerate(lines):
        if len(line) > max_line_chars:
            lines[i] = f"{line[:max_line_chars]} [... line cut: {len(line)} characters]"
            cut += 1
    return ("\n".join(lines), cut) if cut else (text, 0)


def cut_lines_note(cut: int, max_line_chars: int) -> str:
    """The report note for `cut` lines cut by cut_long_lines."""
    return f"{cut} line{'s' if cut > 1 else ''} longer than {max_line_chars} characters cut"


def decode_text(data: bytes, *, max_line_chars: int, declared: str | None = None) -> DecodedText:
    """Decode bytes of a text file and normalise it for the context.

    declared: an encoding the file names itself (HTML <meta charset>), used
    when the bytes are not UTF-8, it can be a charset (_declared_codec) and
    they decode cleanly with it; otherwise the encoding is detected.
    max_line_chars <= 0 keeps long lines (callers that parse the text first).
    """
    text, encoding, replaced, note, uncertain = _decode(data, declared)
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\x00", "")
    text, cut = cut_long_lines(text, max_line_chars)
    result = DecodedText(text=text, encoding=encoding, replaced_chars=replaced, truncated_lines=cut,
                         uncertain=uncertain)
    if note:
        result.notes.append(note)
    elif replaced:
        result.notes.append(f"{replaced} undecodable characters replaced")
    if cut:
        result.notes.append(cut_lines_note(cut, max_line_chars))
    return result
