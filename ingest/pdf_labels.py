"""PDF page labels (the 'xii' or 'A-3' a viewer shows), decoded properly.

PyMuPDF's Page.get_label() parses the /PageLabels rules with string
splitting and hands back the raw PDF string syntax: a prefix written as a
UTF-16BE hex string comes back as '<FEFF0031>' instead of '1', escapes in
literal strings such as '(A\\)B)' or '(\\351)' stay escaped, and a prefix
containing '/' breaks the parse.  This module parses one label rule (the
dictionary text PyMuPDF's Document._get_page_labels() returns for each
range start) and computes the labels itself; decode_pdf_string() turns any
raw PDF string syntax into text (UTF-16BE/LE with BOM, UTF-8 with BOM, else
PDFDocEncoding).  No PyMuPDF import: the parent and the tests use it too.
"""

from __future__ import annotations

import re

# PDFDocEncoding (PDF 32000-1:2008, Annex D.2) differs from Latin-1 in these bytes.
_PDFDOC_DIFF = {
    0x18: "\u02d8", 0x19: "\u02c7", 0x1A: "\u02c6", 0x1B: "\u02d9", 0x1C: "\u02dd", 0x1D: "\u02db",
    0x1E: "\u02da", 0x1F: "\u02dc", 0x80: "\u2022", 0x81: "\u2020", 0x82: "\u2021", 0x83: "\u2026",
    0x84: "\u2014", 0x85: "\u2013", 0x86: "\u0192", 0x87: "\u2044", 0x88: "\u2039", 0x89: "\u203a",
    0x8A: "\u2212", 0x8B: "\u2030", 0x8C: "\u201e", 0x8D: "\u201c", 0x8E: "\u201d", 0x8F: "\u2018",
    0x90: "\u2019", 0x91: "\u201a", 0x92: "\u2122", 0x93: "\ufb01", 0x94: "\ufb02", 0x95: "\u0141",
    0x96: "\u0152", 0x97: "\u0160", 0x98: "\u0178", 0x99: "\u017d", 0x9A: "\u0131", 0x9B: "\u0142",
    0x9C: "\u0153", 0x9D: "\u0161", 0x9E: "\u017e", 0x9F: "\ufffd", 0xA0: "\u20ac", 0xAD: "\ufffd",
    0x7F: "\ufffd",
}
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "b": b"\b", "f": b"\f", "(": b"(", ")": b")", "\\": b"\\"}
_HEX_STRING = re.compile(r"<([0-9A-Fa-f\s]*)>")


def decode_text_bytes(raw: bytes) -> str:
    """Bytes of a PDF text string -> str (BOM-marked Unicode, else PDFDocEncoding); NULs dropped."""
    if raw.startswith(b"\xfe\xff"):
        text = raw[2:].decode("utf-16-be", errors="replace")
    elif raw.startswith(b"\xff\xfe"):  # not in the standard, written by some tools
        text = raw[2:].decode("utf-16-le", errors="replace")
    elif raw.startswith(b"\xef\xbb\xbf"):  # PDF 2.0
        text = raw[3:].decode("utf-8", errors="replace")
    else:
        text = "".join(_PDFDOC_DIFF.get(b, chr(b)) for b in raw)
    return text.replace("\x00", "")


def _hex_bytes(digits: str) -> bytes:
    digits = re.sub(r"\s", "", digits)
    if len(digits) % 2:
        digits += "0"  # a final odd digit is followed by an implied 0
    return bytes.fromhex(digits)


def _literal_bytes(body: str) -> bytes:
    """Contents of a literal string (between the outer parentheses), escapes resolved."""
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("latin-1", errors="replace") if ord(ch) < 256 else ch.encode("utf-8")
            i += 1
            continue
        i += 1
        if i >= len(body):
            break
        nxt = body[i]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt]
            i += 1
        elif nxt in "01234567":
            j = i
            while j < len(body) and j - i < 3 and body[j] in "01234567":
                j += 1
            out.append(int(body[i:j], 8) & 0xFF)
            i = j
        elif nxt == "\r":  # backslash-newline: line continuation
            i += 2 if body[i + 1:i + 2] == "\n" else 1
        elif nxt == "\n":
            i += 1
        else:  # unknown escape: the backslash is ignored
            out += nxt.encode("latin-1", errors="replace")
            i += 1
    return bytes(out)


def decode_pdf_string(value: str) -> str:
    """Text of a value that may still be in PDF string syntax.

    '<FEFF0031>' -> '1', '(T-)' -> 'T-', '(\\351t\\351)' -> 'été'; text that is
    already decoded comes back unchanged, and so do strings that merely
    contain a hex string (only a whole-value hex string is decoded, plus the
    '<FEFF...>' forms PyMuPDF splices into labels).
    """
    stripped = value.strip()
    m = _HEX_STRING.fullmatch(stripped)
    if m:
        return decode_text_bytes(_hex_bytes(m.group(1)))
    if len(stripped) >= 2 and stripped[0] == "(" and stripped[-1] == ")":
        return decode_text_bytes(_literal_bytes(stripped[1:-1]))

    def unicode_hex(match: re.Match) -> str:
        digits = re.sub(r"\s", "", match.group(1))
        if digits[:4].upper() in ("FEFF", "FFFE"):
            return decode_text_bytes(_hex_bytes(digits))
        return match.group(0)

    return _HEX_STRING.sub(unicode_hex, value)


# -- /PageLabels rules ----------------------------------------------------------------------
_MAX_PREFIX = 64  # a hostile rule must not multiply a huge prefix by every page
_NAME_CHARS = re.compile(r"[^\s/<>\[\]()%{}]+")


def _read_string(text: str, i: int) -> tuple[str, int]:
    """A literal '(...)' (nested parentheses, escapes) or hex '<...>' string at text[i]."""
    if text[i] == "<":
        end = text.index(">", i)
        return decode_text_bytes(_hex_bytes(text[i + 1:end])), end + 1
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return decode_text_bytes(_literal_bytes(text[i + 1:j])), j + 1
        j += 1
    return decode_text_bytes(_literal_bytes(text[i + 1:])), len(text)


def _unescape_name(name: str) -> str:
    return re.sub(r"#([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name)


def parse_label_rule(rule: str) -> dict:
    """'<</S/r/P(A-)/St 3>>' -> {'style': 'r', 'prefix': 'A-', 'first': 3}.

    Only the three label keys are read; anything else (/Type, unknown keys)
    is skipped.  Malformed rules give what could be read.
    """
    text = _dictionary_body(rule)
    out = {"style": "", "prefix": "", "first": 1}
    i, key = 0, None
    while i < len(text):
        kind, token, i = _next_token(text, i)
        if kind == _END:
            break
        if kind == _SKIP:
            continue
        if kind == _NAME and key is None:
            key = token
            continue
        _set_label_entry(out, key, token)
        key = None
    return out


def _dictionary_body(rule: str) -> str:
    """The rule's text inside '<<' and '>>' (either may be missing)."""
    text = rule.strip()
    if text.startswith("<<"):
        text = text[2:]
    if text.endswith(">>"):
        text = text[:-2]
    return text


# Kinds of token in a rule: a /Name (a key, or a value after a key), any other value, nothing, or a broken rest.
_NAME, _VALUE, _SKIP, _END = "name", "value", "skip", "end"
_BARE_VALUE = re.compile(r"[^\s/<>\[\]()]+")


def _next_token(text: str, i: int) -> tuple[str, object, int]:
    """(kind, token, index after it) for the token at text[i]."""
    ch = text[i]
    if ch.isspace():
        return _SKIP, None, i + 1
    if ch == "/":
        m = _NAME_CHARS.match(text, i + 1)
        return (_NAME, _unescape_name(m.group(0)), m.end()) if m else (_NAME, "", i + 1)
    if ch in "(<" and not text.startswith("<<", i):
        try:
            value, end = _read_string(text, i)
        except ValueError:  # a broken hex string (unterminated, not hex): nothing after it can be read
            return _END, None, i
        return _VALUE, value, end
    m = _BARE_VALUE.match(text, i)
    if not m:  # a delimiter that starts no value ('>', ']', a nested '<<')
        return _SKIP, None, i + 1
    return _VALUE, m.group(0), m.end()


def _set_label_entry(out: dict, key: str | None, value: object) -> None:
    """Store `value` under the label key it belongs to; values of other keys are dropped."""
    if key == "S" and isinstance(value, str):
        out["style"] = value
    elif key == "P" and isinstance(value, str):
        out["prefix"] = value[:_MAX_PREFIX]
    elif key == "St":
        try:
            out["first"] = min(max(1, int(float(value))), 10**9)
        except (TypeError, ValueError, OverflowError):
            pass


_MAX_SPELLED = 10_000  # roman numerals and letter runs above this are written as digits


def _roman(n: int) -> str:
    if n <= 0 or n > _MAX_SPELLED:
        return str(n)
    parts = []
    for value, numeral in ((1000, "m"), (900, "cm"), (500, "d"), (400, "cd"), (100, "c"), (90, "xc"),
                           (50, "l"), (40, "xl"), (10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i")):
        count, n = divmod(n, value)
        parts.append(numeral * count)
    return "".join(parts)


def _letters(n: int) -> str:
    """1 -> a, 26 -> z, 27 -> aa, 52 -> zz, 53 -> aaa (the PDF rule: one letter, repeated)."""
    if n <= 0 or n > _MAX_SPELLED:
        return str(n)
    return chr(ord("a") + (n - 1) % 26) * ((n - 1) // 26 + 1)


def format_label(rule: dict, offset: int) -> str:
    """Label of the page `offset` pages after the start of `rule`'s range."""
    number = rule.get("first", 1) + offset
    style = rule.get("style", "")
    if style == "D":
        shown = str(number)
    elif style in ("r", "R"):
        shown = _roman(number)
    elif style in ("a", "A"):
        shown = _letters(number)
    else:
        shown = ""
    if style in ("R", "A"):
        shown = shown.upper()
    return rule.get("prefix", "") + shown


def page_labels(rules: list[tuple[int, str]], page_count: int) -> list[str]:
    """Labels of every page from (start page index, rule dictionary text) pairs; '' before the first rule.

    Surrounding whitespace is dropped (a prefix 'Chapter ' without a style).
    """
    labels = [""] * page_count
    parsed = sorted(((int(start), parse_label_rule(rule)) for start, rule in rules), key=lambda r: r[0])
    for k, (start, rule) in enumerate(parsed):
        end = parsed[k + 1][0] if k + 1 < len(parsed) else page_count
        for index in range(max(0, start), min(end, page_count)):
            labels[index] = format_label(rule, index - start).strip()
    return labels
