"""The development set: questions with short known answers about real documents that installed packages ship.

One JSON file per document under ``benchmarks/devset/``: the document (a path; ``h11.zip`` is made from the
installed ``h11`` package by ``document_path``), and its questions in the order a user asks them, each with
regular expressions that count as a right answer (case-insensitive), where the answer is stated (PDF pages as
``ingest`` numbers them, or a file's 1-based lines) and whether it is asked in words the document does not use.

Six splits: settings were chosen on ``TUNE`` and checked on ``CONFIRM``; ``CONFIRM``'s failures were then read
and the number of passages quoted was chosen on both, so ``HOLDOUT`` (written after that, by a helper that read
only its two documents) was the split no setting was chosen on, until its failures were read too. ``FRESH`` was
written later by a helper that read only its three documents and never saw an answer, with a third of its
questions follow-ups ("And of SHA384?") that need the question before them, as users ask; it is asked once, after
the settings it checks were chosen. ``BLIND`` was written the same way once the fresh split's failures had been
read, with the 397-page Valgrind manual the size of a long manual a user drops in whole. ``REFERENCE``, gnuplot's
311-page manual, a command reference whose sections read alike, was written the same way after chunks were given
their outline headings, to measure them where they should matter most. ``MANUALS``, the GNU Octave manual (1,158
pages, a numerical language's guide and function reference) and the Bash Reference Manual, the nearest in kind to
R's manuals that Debian ships, was written the same way before any run; the Asymptote manual (196 pages, a
graphics language's texinfo manual) was added to it the same way, written after that run's failures were read, and
Octave's C++ library manual (57 pages, ``liboctave``, from octave-doc too) after the recall slot was chosen, to ask
it on a document that choice never read; the Libgcrypt manual (148 pages, a C library's guide and reference) was
written the same way before any run on it. R's manuals (Debian's r-doc-pdf) are kept out: the app is judged on them
from outside.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent / "devset"
TUNE = ("mime", "libtasn1", "argparse", "xlfd")
CONFIRM = ("icccm", "libidn2", "h11")
HOLDOUT = ("bzip2", "fontconfig")
FRESH = ("crc", "nettle", "cookiejar")
BLIND = ("valgrind", "xace", "tarfile")
REFERENCE = ("gnuplot",)
MANUALS = ("octave", "bashref", "asymptote", "liboctave", "gcrypt", "pspp")
SPLITS = {"tune": TUNE, "confirm": CONFIRM, "holdout": HOLDOUT, "fresh": FRESH, "blind": BLIND, "reference": REFERENCE,
          "manuals": MANUALS}
# Debian packages that ship the documents (scripts/test.sh installs them).
DEBIAN_PACKAGES = ("shared-mime-info", "libtasn1-doc", "xorg-docs", "libidn2-doc", "bzip2-doc", "fontconfig",
                   "zlib1g-dev", "nettle-dev", "valgrind", "gnuplot-doc", "octave-doc", "bash-doc", "asymptote-doc",
                   "libgcrypt20-doc", "pspp")


@dataclass(frozen=True)
class Question:
    document: str
    question: str
    answers: tuple[str, ...]
    pages: tuple[int, ...] = ()
    file: str = ""  # source code: the display path of the file (ingest's), and the lines stating the answer
    lines: tuple[int, ...] = ()
    paraphrased: bool = False
    followup: bool = False  # continues the question before it ("And of SHA384?"): not answerable on its own

    def is_right(self, answer: str) -> bool:
        return any(re.search(p, answer, flags=re.IGNORECASE) for p in self.answers)

    def holds(self, where) -> bool:
        """Whether a cited passage (an ``ingest.Provenance``) states the answer: the page, or a chunk of the file
        whose line range covers one of the lines."""
        if self.pages:
            return where.page in self.pages
        if where.line_start is None or not self._same_file(where.source):
            return False
        return any(where.line_start <= line <= where.line_end for line in self.lines)

    def _same_file(self, source: str) -> bool:
        return source == self.file or source.endswith("/" + self.file) or self.file.endswith("/" + source)


@dataclass(frozen=True)
class Document:
    name: str
    path: str
    questions: tuple[Question, ...]


def load(names: tuple[str, ...] | None = None) -> list[Document]:
    """The documents ``names`` (every split's, in SPLITS' order, by default) with their questions."""
    documents = []
    for name in names if names is not None else sum(SPLITS.values(), ()):
        data = json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))
        questions = tuple(Question(data["document"], q["question"], tuple(q["answers"]), tuple(q.get("pages", ())),
                                   q.get("file", ""), tuple(q.get("lines", ())), bool(q.get("paraphrased")),
                                   bool(q.get("followup")))
                          for q in data["questions"])
        documents.append(Document(name, data["document"], questions))
    return documents


def split(name: str) -> str:
    return next(split for split, names in SPLITS.items() if name in names)


def document_path(document: Document, scratch: Path) -> Path:
    """Where the document is read from: its installed path, or for ``h11.zip`` a zip of the installed package's
    .py files made in ``scratch`` (the same bytes every time: sorted names, fixed times)."""
    if document.path != "h11.zip":
        path = Path(document.path)
        if not path.is_file():
            raise SystemExit(f"{path} is missing: apt-get install {' '.join(DEBIAN_PACKAGES)}")
        return path
    import h11

    package = Path(h11.__file__).parent
    target = scratch / "h11.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(package.rglob("*.py")):
            info = zipfile.ZipInfo(f"h11/{file.relative_to(package)}", date_time=(2020, 1, 1, 0, 0, 0))
            archive.writestr(info, file.read_bytes())
    return target
