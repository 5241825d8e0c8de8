"""Text from outside (a chat box, a name, an imported file) cleaned at the door, so that it can always be sent.

JSON from a client, or a JSON record in a file, can carry a lone surrogate ("\\ud800"): a Python string holds
it, but UTF-8 cannot, so the first reply or save that encodes it fails ("surrogates not allowed"), and a
workspace saved with it fails at every reload. Each such code point becomes U+FFFD (the replacement
character); a surrogate pair split into two code points is joined into the character it stands for.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as UTF-8 can hold it (most text has no surrogate and is returned as it is, uncopied)."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_strings(value):
    """Every string in a parsed JSON value (keys included) cleaned; the value's depth is bounded by the
    record's checks before it is parsed (workspace_record.check_shape)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean_strings(item) for item in value]
    if isinstance(value, dict):
        return {clean_text(key): clean_strings(item) for key, item in value.items()}
    return value
