"""A PDF's outline as the heading each chunk falls under (ingest/outline.py): found where its title stands on its
page, carried by the chunk's provenance, and read safely from hostile bookmarks."""

from __future__ import annotations

import ingest
from ingest.outline import (MAX_OUTLINE_ENTRIES, MAX_SEARCHES_PER_PAGE, MAX_TITLE_CHARS, HeadingTracker,
                            OutlineEntry, clean_title, read_outline)
from ingest_fixtures import WordTokenizer, make_pdf

OPTIONS = [f"option{i} sets the widget's option{i} value to one of its settings" for i in range(12)]
COLOURS = [f"colour{i} paints the widget in shade {i} of the palette" for i in range(12)]
TOC = [[1, "Widget Manual", 1], [2, "2 Options", 2], [3, "2.1 Colours", 2], [2, "3 Appendix", 4],
       [3, "Glossary", 5]]


def _manual(tmp_path):
    pages = ["Widget Manual\nThis manual describes widgets.",
             "\n".join(["2 Options", *OPTIONS, "2.1 Colours", *COLOURS[:6]]),
             "\n".join(COLOURS[6:]),
             None,  # blank: its entry applies from the next page with text
             "appendix words without the entry's title"]
    return make_pdf(tmp_path / "widget.pdf", pages, toc=TOC)


def test_each_chunk_carries_the_heading_in_force_where_its_words_start(tmp_path):
    corpus = ingest.ingest([_manual(tmp_path)], tokenizer=WordTokenizer(), chunk_tokens=40)
    colours_at = corpus.text.index("2.1 Colours")
    on_page_two = []
    for chunk in corpus.chunks:
        body = chunk.text[chunk.header_chars:]
        words_at = chunk.char_start + chunk.header_chars + len(body) - len(body.lstrip())
        if chunk.page == 1:
            expected = "Widget Manual"
        elif chunk.page == 2:
            expected = "2 Options › 2.1 Colours" if words_at >= colours_at else "Widget Manual › 2 Options"
            on_page_two.append(expected)
        elif chunk.page == 3:
            expected = "2 Options › 2.1 Colours"
        else:  # the blank page's entry applied, then the one whose title is not on its page, from the page's top
            assert chunk.page == 5
            expected = "3 Appendix › Glossary"
        assert chunk.where.heading == expected, (chunk.page, chunk.text[:40])
    assert len(set(on_page_two)) == 2  # page two's chunks fall under both of its headings
    assert {c.page for c in corpus.chunks} == {1, 2, 3, 5}


def test_the_heading_is_kept_out_of_where_a_chunk_is(tmp_path):
    corpus = ingest.ingest([_manual(tmp_path)], tokenizer=WordTokenizer(), chunk_tokens=40)
    two = [c.where for c in corpus.chunks if c.page == 2]
    assert len({w.heading for w in two}) == 2 and len(set(two)) == 1  # one page, one place, two headings
    assert all(w.page_only().heading is None for w in two)
    assert two[-1].as_dict()["heading"] == "2 Options › 2.1 Colours"


def test_files_without_an_outline_have_no_headings(tmp_path):
    (tmp_path / "notes.md").write_text("# Notes\n\n" + "\n\n".join(OPTIONS))
    pdf = make_pdf(tmp_path / "plain.pdf", ["\n".join(OPTIONS)])
    corpus = ingest.ingest([tmp_path / "notes.md", pdf], tokenizer=WordTokenizer(), chunk_tokens=40)
    assert len(corpus.chunks) > 2 and all(c.where.heading is None for c in corpus.chunks)


def test_a_title_wrapped_over_two_lines_or_with_no_break_spaces_is_found_where_it_stands():
    tracker = HeadingTracker([OutlineEntry(1, "Core Command-line Options", 3),
                              OutlineEntry(2, "Uncommon\u00a0Options", 3)])
    text = "end of the last section " * 6 + "\n\nCore Command-line\nOptions\n\nmore\n\nUncommon Options\n\nrare flags"
    tracker.enter_page(3, text)
    assert tracker.heading_at(0) is None  # before the outline's first entry
    assert tracker.heading_at(text.index("Core")) == "Core Command-line Options"
    assert tracker.heading_at(text.index("more")) == "Core Command-line Options"
    assert tracker.heading_at(text.index("rare")) == "Core Command-line Options › Uncommon\u00a0Options"


def test_an_outline_out_of_page_order_is_walked_in_page_order():
    tracker = HeadingTracker([OutlineEntry(1, "Late", 9), OutlineEntry(1, "Early", 2)])
    tracker.enter_page(4, "text")
    assert tracker.heading_at(0) == "Early"
    tracker.enter_page(9, "Late starts here")
    assert tracker.heading_at(0) == "Late"


def test_hostile_bookmarks_are_cleaned_capped_and_nested_as_an_outline_nests():
    raw = [[1, "Top", 1], [7, "Too deep", 2], ["1", "Level as text", 2], [1, "", 3], [1, "Nowhere", -1],
           [2, "Bell\x07and\x1b[31m escape " + "y" * 400, 4], "not an entry", [1, "Short"], [1, 5, 3]]
    entries = read_outline(raw)
    assert [(e.level, e.page) for e in entries] == [(1, 1), (2, 2), (2, 4)]
    assert entries[1].title == "Too deep"  # seven levels below none: one below the entry before
    assert entries[2].title.startswith("Bell and [31m escape yyy") and len(entries[2].title) == MAX_TITLE_CHARS
    assert entries[2].title.endswith("…")
    assert len(read_outline([[1, "t", 1]] * (MAX_OUTLINE_ENTRIES + 5))) == MAX_OUTLINE_ENTRIES
    assert clean_title("  two\nlines\u00a0here ") == "two lines here"


def test_a_pdf_with_thousands_of_bookmarks_on_one_page_reads_whole(tmp_path):
    toc = [[1, f"Entry {i}", 1] for i in range(3000)]
    pdf = make_pdf(tmp_path / "many.pdf", ["Entry 2999 is the last\n" + "\n".join(OPTIONS)], toc=toc)
    corpus = ingest.ingest([pdf], tokenizer=WordTokenizer(), chunk_tokens=40)
    assert corpus.reports[0].status == "ingested"
    assert corpus.chunks[-1].where.heading == "Entry 2999"


def test_titles_past_the_searches_a_page_allows_start_where_the_last_one_searched_did():
    entries = [OutlineEntry(1, f"Title {i}", 2) for i in range(MAX_SEARCHES_PER_PAGE + 2)]
    text = "x " * 200 + "".join(f"\nTitle {i}\nwords" for i in range(len(entries)))
    tracker = HeadingTracker(entries)
    tracker.enter_page(2, text)
    last_searched = text.index(f"Title {MAX_SEARCHES_PER_PAGE - 1}\n")
    assert tracker.heading_at(last_searched - 1) == f"Title {MAX_SEARCHES_PER_PAGE - 2}"
    assert tracker.heading_at(last_searched) == f"Title {MAX_SEARCHES_PER_PAGE + 1}"  # the rest start there too


def test_a_title_after_only_a_running_header_starts_its_entry_at_the_pages_top():
    tracker = HeadingTracker([OutlineEntry(1, "2.1. Layout", 3), OutlineEntry(1, "2.2. Sources", 4),
                              OutlineEntry(1, "2.3. Magic", 4)])
    tracker.enter_page(3, "2.1. Layout\n\nfolders")
    assert tracker.heading_at(0) == "2.1. Layout"
    page = "Shared MIME-info Database\n12\n\n2.2. Sources\n\nsource files\n\n" + "more words " * 20 + "\n2.3. Magic\n"
    tracker.enter_page(4, page)
    assert tracker.heading_at(0) == "2.2. Sources"  # the running header and page number are the page's, not 2.1's
    assert tracker.heading_at(page.index("more")) == "2.2. Sources"  # too far down to be the page's top
    assert tracker.heading_at(page.index("2.3.")) == "2.3. Magic"
