"""Benchmark tables land on the docs page that holds their markers, new ones on docs/benchmarks.md; README, the
front door, is left as it is; links written from the repository's root are made relative to the page."""

from __future__ import annotations

from benchmarks import real_model
from benchmarks.report import splice_readme

FRONT = "# Project\n\n## Two commands\n"


def pages(tmp_path, **docs):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(FRONT)
    for name, text in docs.items():
        (tmp_path / "docs" / f"{name}.md").write_text(text)
    return tmp_path / "README.md"


def test_a_block_is_rewritten_where_its_markers_are_with_links_from_that_page(tmp_path):
    readme = pages(tmp_path, gpu="# GPU\n\n<!-- speed:begin -->\nold\n<!-- speed:end -->\n\nafter\n")
    splice_readme(readme, "speed", "new ![plot](benchmarks/results/speed.png) [doc](https://x.org/a.md) [s](#top)")
    assert (tmp_path / "docs/gpu.md").read_text() == (
        "# GPU\n\n<!-- speed:begin -->\nnew ![plot](../benchmarks/results/speed.png) [doc](https://x.org/a.md) "
        "[s](#top)\n<!-- speed:end -->\n\nafter\n")
    assert readme.read_text() == FRONT and not (tmp_path / "docs/benchmarks.md").exists()


def test_a_new_block_goes_to_docs_benchmarks_not_to_the_readme(tmp_path):
    readme = pages(tmp_path, benchmarks="# Benchmarks\n")
    splice_readme(readme, "many_files", "| a |\n\n![p](benchmarks/results/p.png)")
    assert (tmp_path / "docs/benchmarks.md").read_text() == (
        "# Benchmarks\n\n<!-- many_files:begin -->\n| a |\n\n![p](../benchmarks/results/p.png)\n<!-- many_files:end -->\n")
    assert readme.read_text() == FRONT
    splice_readme(readme, "many_files", "| b |")  # a second run rewrites, it does not append
    assert (tmp_path / "docs/benchmarks.md").read_text().count("many_files:begin") == 1


def test_the_real_models_blocks_stay_on_their_page_and_speed_follows_quality(tmp_path):
    readme = pages(tmp_path, smollm2="# SmolLM2\n\n<!-- quality_real:begin -->\nold\n<!-- quality_real:end -->\n\nclosing words\n",
                   benchmarks="# Benchmarks\n\n## Quality beyond the training length (demo model)\n\nx\n")
    real_model.splice_readme_after(readme, "quality_real", "q")
    real_model.splice_readme_after(readme, "speed_real", "s")
    smollm2 = (tmp_path / "docs/smollm2.md").read_text()
    assert smollm2.index("<!-- quality_real:begin -->\nq\n") < smollm2.index(real_model.TITLES["speed_real"]) \
        < smollm2.index("<!-- speed_real:begin -->\ns\n<!-- speed_real:end -->") < smollm2.index("closing words")
    assert readme.read_text() == FRONT and "real" not in (tmp_path / "docs/benchmarks.md").read_text()
