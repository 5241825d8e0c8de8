"""Long PDFs, code repositories and text -> one context with provenance.

No Gradio or torch dependency; PyMuPDF runs only in a worker process.

Public API
----------
ingest(sources, *, tokenizer=None, password=None, limits=IngestLimits(),
       progress=None, cancel=None, chunk_tokens=512, allow_urls=True) -> Corpus
    sources: one or a list of str/Path: files (PDF, text, Markdown, code,
    HTML, Jupyter notebooks; also compressed alone, manual.pdf.gz, .bz2 or
    .xz, read as the file inside), folders (read as repositories), archives
    (.zip, .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz; read as repositories,
    never extracted to disk) and https:// git URLs (shallow clone; other
    schemes are refused, an unreachable host fails within dns_timeout_s).
    Display paths (FileReport.path, Chunk.source, headers, citations) are
    the same whatever else is ingested alongside: 'notes.txt' for a file,
    'proj/src/app.py' for a folder 'proj', 'repo.zip/demo_repo/README.md'
    for an archive entry (archive name + path inside), 'name/...' for a
    git URL; a repeated display path gets ' (2)'.
    password: str for every encrypted PDF, or {path: password} keyed by the
    path given, the display path, or the file name.
    limits: IngestLimits (None also means the defaults).
    progress: called with a ProgressEvent after each listing, page, file and
    chunked document.
    cancel: any object with is_set() (threading.Event); checked between
    files, pages and chunks.  Cancelling RAISES IngestCancelled, whose
    .reports holds the reports finished so far; no partial Corpus.
    chunk_tokens: target chunk size, measured with the tokenizer.

Corpus
    .reports  list[FileReport], one per input file INCLUDING skipped ones
              (a pruned folder such as node_modules/ or a refused archive/URL
              is one report).  FileReport: path, status ('ingested' |
              'partial' | 'skipped' | 'error'), reason (sentence; '' when
              fine, may carry a note such as a detected encoding; an
              encoding guess the detector was unsure of says 'encoding
              guessed as X (uncertain: ...)' and makes the file 'partial'),
              pages, chars, tokens, bytes, language.
    .chunks   list[Chunk] in context order: text, source, page (1-based or
              None), page_label, line_start/line_end (1-based for text/code,
              else None; for HTML and notebooks, lines of the produced
              text, whose '# %% [code] cell 3' markers name the cell),
              char_start/char_end (into .text), tokens (what chunking
              sized it by), index, language.
    .text     == ''.join(c.text for c in chunks); headers are part of the
              first chunk of each file ('### src/app.py (python)' for code,
              '### paper.pdf' for prose; control characters in the path
              escaped) and page ('--- page 12 ---', or '--- page 12 (xii) ---'
              when the PDF's page label differs from the number; labels are
              decoded from PDF string syntax, '<FEFF0031>' -> '1').
    .n_tokens sum of chunk tokens (chunks are tokenised one by one, as the
              app feeds them).  .tokens_exact: False when estimated.
    .locate(char_offset) -> Location(source, page, page_label, line, chunk)
    .chunks_of(source), .totals(), .estimate_kv_bytes(**model_dims)

citation_label(source, page, page_label, line_start, line_end) -> str
    'paper.pdf p. 5', 'paper.pdf p. 12 (xii)' (label only when it differs
    from the number), 'src/app.py:40-88'.

plan(sources, *, limits=None, allow_urls=True) -> list[PlanItem]
    Budget BEFORE expensive work: lists sources with ingest()'s rules
    (same display paths, skip rules, limits) without reading files, opening
    PDFs or tokenising.  PlanItem(path, bytes, tokens_upper, note) is a
    NamedTuple: bytes from stat / zip central directory / tar headers
    (compressed tars are decompressed once to read headers, data not kept);
    tokens_upper is an upper bound of the tokens the file adds (file bytes +
    header: a token covers at least one byte of UTF-8 text), 0 for files
    that will be skipped (note says why), None for git URLs (unknown until
    cloned).  For PDFs it is a heuristic (1 token per byte of the file,
    note says so).  sum(tokens_upper) <= the free budget means the source
    fits (text bounds are ~3-4x the real count for prose and code), so the
    app can accept such a source outright and refuse, before reading it,
    one whose bound is over budget (or read it anyway and trim after).
    python -m ingest --plan PATH... prints it.

Chunks never span files or pages: a file is split into sections (a PDF page,
or a whole text file) and each section is split by langchain's
RecursiveCharacterTextSplitter (from_language for code) into chunks of about
chunk_tokens tokens.  Chunk boundaries tile the text exactly (no overlap).

Tokens: `tokenizer` is anything with encode(text, add_special_tokens=False)
-> list[int] (a Hugging Face tokenizer).  Without one, counts come from
estimate_tokens(), a regex heuristic shaped after Llama's tokenizer (ASCII
words ~1 token + 1 per 4 letters beyond 4; digits, punctuation, newlines,
non-ASCII characters and indentation runs 1 each), typically within 25%.

estimate_kv_bytes(n_tokens, *, num_layers, num_kv_heads, head_dim,
                  dtype_bytes=2, window=None, n_starting=10, topk=0) -> dict
    full (vanilla) vs LM-Infinite bounded cache (starting + window tokens per
    layer; plus a middle store of all tokens when topk > 0).
    kv_dims_from_config(hf_config) gives the three model dimensions.

Formats: text and code by content (any name; language labels from
ingest.languages), PDFs (PyMuPDF in a worker), HTML (.html/.htm/.xhtml:
readable text via html.parser, scripts and styles dropped), Jupyter
notebooks (.ipynb: code and Markdown cells with '# %% [code] cell N'
markers, outputs dropped), XML as text.  Office documents (.docx, .xlsx,
.pptx ...) are reported as not read (no parser dependency).

Command line: python -m ingest PATH... [--password P] [--json]
    [--chunk-tokens N] [--tokenizer NAME_OR_FOLDER] [--no-urls] [--plan]
    Without --tokenizer, token counts are estimates: the table heads them
    'TOKENS (est.)' and says so in a footnote; the KV line is a Llama-2-7B
    estimate.  Names and reasons are printed with control characters
    escaped.  --plan prints plan() instead of ingesting.

Processes: PDFs are extracted in one shared 'spawn' worker process (killed
and restarted on timeout or crash; requests serialised by a lock), so the
app's entry script must guard start-up with `if __name__ == "__main__":`.
shutdown_pdf_worker() stops it early.
"""

from .corpus import Chunk, Corpus
from .kv_memory import estimate_kv_bytes, kv_dims_from_config
from .limits import IngestLimits
from .pdf import shutdown_pdf_worker
from .pipeline import ingest
from .plan import PlanItem, plan
from .report import format_table, to_json
from .results import FileReport, IngestCancelled, Location, ProgressEvent, Provenance, citation_label
from .tokens import TokenCounter, estimate_tokens

__all__ = [
    "Chunk", "Corpus", "FileReport", "IngestCancelled", "IngestLimits", "Location", "PlanItem", "ProgressEvent", "Provenance",
    "TokenCounter", "citation_label", "estimate_kv_bytes", "estimate_tokens", "format_table", "ingest",
    "kv_dims_from_config", "plan",
    "shutdown_pdf_worker", "to_json",
]
