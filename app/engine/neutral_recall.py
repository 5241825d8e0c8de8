"""The neutral question's recall, read once for the documents a context holds.

Sources are ranked by where a question's recall goes beyond where a question that asks nothing in particular goes
(``citations.relevance``): the title pages and tables every question's recall visits. Those are places in the
documents, not in the conversation, and only document positions are scored; yet the neutral question was read
before every question, a forward with recall over the whole middle store like the question's own. Read once, the
first token came 2.6 s sooner at the median over `tarfile.py`'s questions (20.8 → 18.2 s, the 1.5B on 2 threads),
and as many answers and first sources were right on XACE's and tarfile's 22 (19 and 17; docs/answers.md).

It is read at the first question with recall, kept (and saved with a workspace, context_file.py: a reopened
context ranks as the one never closed), and read again once the documents or top-k change. Tokens that leave the
window after it was read (the documents' last ~2K, as the conversation pushes them out) get no share of it: the
question's recall on them is not discounted.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from dataclasses import dataclass

from .citations import RecallTally
from .spans import SpanIndex

KEY_BYTES = 16  # a documents_key's length (a saved one is checked against it: workspace_record.py)


def documents_key(token_ids: array, spans: SpanIndex, topk: int) -> bytes:
    """Changes when top-k does, or any document's place or tokens, or any token before the last document."""
    digest = hashlib.blake2b(struct.pack("<q", topk), digest_size=KEY_BYTES)
    end = 0
    for span in spans.documents():
        digest.update(struct.pack("<qq", span.start, span.end))
        end = span.end
    digest.update(memoryview(token_ids)[:end])
    return digest.digest()


@dataclass(frozen=True)
class NeutralRecall:
    """The neutral question's recall tally, and the ``documents_key`` of the context it was read in."""

    key: bytes
    tally: RecallTally
