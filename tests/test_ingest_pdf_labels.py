"""PDF page labels: decoded from PDF string syntax, shown only when they differ from the page number."""

from __future__ import annotations

import re
from pathlib import Path

import pymupdf
import pytest

import ingest
from ingest.pdf_labels import decode_pdf_string, page_labels, parse_label_rule
from ingest_fixtures import report_for

SPEC_PDF = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")  # labels written as <FEFF0031>
TASN1_PDF = Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")  # 'T-1', 'T-2', then roman, then decimal


def _labelled_pdf(path: Path, page_labels_object: str, pages: int) -> Path:
    """A PDF whose /PageLabels tree is written verbatim (PDF string syntax as real producers write it)."""
    doc = pymupdf.open()
    for i in range(pages):
        doc.new_page().insert_text((72, 72), f"body of page {i + 1} w{i + 1}x")
    doc.xref_set_key(doc.pdf_catalog(), "PageLabels", page_labels_object)
    doc.save(path)
    doc.close()
    return path


def test_utf16_hex_labels_are_decoded_and_omitted_when_equal_to_the_page_number(tmp_path):
    pdf = _labelled_pdf(tmp_path / "hex.pdf", r"<</Nums[0<</P<FEFF0031>>>1<</P<FEFF0032>>>2<</S/r/St 3>>]>>", 3)
    corpus = ingest.ingest([pdf])
    assert [(c.page, c.page_label) for c in corpus.chunks] == [(1, "1"), (2, "2"), (3, "iii")]
    assert "<FEFF" not in corpus.text
    assert re.findall(r"--- page [^\n]*", corpus.text) == ["--- page 1 ---", "--- page 2 ---", "--- page 3 (iii) ---"]
    cites = [corpus.locate(corpus.text.index(f"w{n}x")).cite() for n in (1, 2, 3)]
    assert cites == ["hex.pdf p. 1", "hex.pdf p. 2", "hex.pdf p. 3 (iii)"]


def test_literal_string_escapes_pdfdocencoding_and_slashes_in_prefixes(tmp_path):
    rules = r"<</Nums[0<</P(A\/B\)-)/S/D>>1<</P(\351t\351 )>>2<</S/A/St 27>>]>>"
    pdf = _labelled_pdf(tmp_path / "lit.pdf", rules, 3)
    corpus = ingest.ingest([pdf])
    assert [c.page_label for c in corpus.chunks] == ["A/B)-1", "été", "AA"]
    assert "--- page 1 (A/B)-1) ---" in corpus.text and "--- page 3 (AA) ---" in corpus.text


@pytest.mark.skipif(not SPEC_PDF.exists(), reason="shared-mime-info spec PDF not installed")
def test_real_pdf_with_hex_labels_cites_plain_page_numbers():
    corpus = ingest.ingest([SPEC_PDF])
    report = report_for(corpus, "shared-mime-info-spec.pdf")
    assert (report.status, report.pages) == ("ingested", 17)
    assert "<FEFF" not in corpus.text and "(<" not in corpus.text
    assert corpus.text.startswith("### shared-mime-info-spec.pdf\n--- page 1 ---\n")
    page5 = next(c for c in corpus.chunks if c.page == 5)
    assert page5.page_label == "5"
    assert ingest.citation_label(page5.source, page5.page, page5.page_label) == "shared-mime-info-spec.pdf p. 5"
    assert corpus.locate(page5.char_start + page5.header_chars).cite() == "shared-mime-info-spec.pdf p. 5"


@pytest.mark.skipif(not TASN1_PDF.exists(), reason="libtasn1 manual PDF not installed")
def test_real_pdf_with_prefixed_and_roman_labels():
    corpus = ingest.ingest([TASN1_PDF])
    labels = {c.page: c.page_label for c in corpus.chunks}
    assert (labels[1], labels[3], labels[4]) == ("T-1", "i", "1")
    assert "--- page 3 (i) ---" in corpus.text and "--- page 1 (T-1) ---" in corpus.text
    assert ingest.citation_label("libtasn1.pdf", 3, "i") == "libtasn1.pdf p. 3 (i)"


def test_label_helpers():
    _check_pdf_strings_decode()
    _check_label_rules_number_pages()
    _check_citation_labels()


def _check_pdf_strings_decode():
    assert decode_pdf_string("<FEFF0031>") == "1"
    assert decode_pdf_string("<FEFF00310032>") == "12"
    assert decode_pdf_string("<feff 0078 0069>") == "xi"  # whitespace and lower-case hex
    assert decode_pdf_string("(T-)") == "T-"
    assert decode_pdf_string(r"(\351t\351)") == "été"  # PDFDocEncoding via octal escapes
    assert decode_pdf_string("(\x84)") == "\u2014"  # PDFDocEncoding differs from Latin-1 at 0x80-0x9F
    assert decode_pdf_string("xii") == "xii" and decode_pdf_string("<b>") != ""
    assert decode_pdf_string("A-<FEFF0031>") == "A-1"  # PyMuPDF splices raw hex into a label


def _check_label_rules_number_pages():
    assert parse_label_rule(r"<</S/r/P(A\)/B)/St 3>>") == {"style": "r", "prefix": "A)/B", "first": 3}
    assert parse_label_rule("<</Type/PageLabel/P<FEFF0041002D>/S/D>>")["prefix"] == "A-"
    assert page_labels([(0, "<</S/a>>")], 28)[25:] == ["z", "aa", "bb"]
    assert page_labels([(2, "<</S/D>>")], 3) == ["", "", "1"]  # pages before the first rule have no label
    assert page_labels([(0, "<</S/R/St 99999999999>>")], 1) == ["1000000000"]  # absurd numbers stay short


def _check_citation_labels():
    assert ingest.citation_label("a.pdf", 5, "5") == "a.pdf p. 5"
    assert ingest.citation_label("a.pdf", 12, "xii") == "a.pdf p. 12 (xii)"
