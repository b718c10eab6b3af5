"""The code on every documentation page outside docs/concepts/ runs and prints what the page
says (tests/docs/pages.py); the concept pages run in test_docs_concept_pages.py, the other
libraries' blocks in test_docs_peer_blocks.py; the page runner's own tests are here."""

from __future__ import annotations

import traceback
from pathlib import Path

import pages
import pytest


@pytest.mark.parametrize("page", [p for p in pages.pages() if not p.startswith("concepts/")])
def test_page_runs(page: str, shape_checks_restored: None) -> None:
    pages.run_page(page)


def test_markers_and_pages_are_known() -> None:
    for page in pages.pages():
        for block in pages.blocks(page):
            assert block.peer is None or block.peer in pages.PEER_MODULES, block.where
    for page in pages.SKIP_PAGES:
        assert (pages.DOCS / page).exists(), f"SKIP_PAGES names docs/{page}, which is gone"
    # The pages with code are all found, in folders too (a new page is picked up by itself).
    found = set(pages.pages())
    assert {"index.md", "faq.md", "concepts/saving.md", "concepts/state.md"} <= found


def test_runner_reads_the_page_conventions(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "page.md").write_text(
        "```python\nx = 2\nprint(x)\n```\n\n```text\n2\n```\n\n"
        "- in a list:\n\n  ```python\n  print('a   b', x + 1)\n  ```\n\n"
        "  ```output\n  a b ...\n  ```\n\n"
        "<!-- skip -->\n```python\nraise AssertionError('a skipped block ran')\n```\n\n"
        "<!-- peer: equinox -->\n```python\ny = x  # only in the peer's namespace\n```\n\n"
        "```bash\nexit 1\n```\n"
    )
    (tmp_path / "prose.md").write_text("No code here.\n")
    monkeypatch.setattr(pages, "DOCS", tmp_path)
    assert pages.pages() == ["sub/page.md"]
    kinds = [(b.kind, b.peer, b.expected) for b in pages.blocks("sub/page.md")]
    assert kinds == [
        ("treemod", None, "2\n"),
        ("treemod", None, "a b ...\n"),
        ("skip", None, None),
        ("peer", "equinox", None),
    ]
    run = pages.run_page("sub/page.md")
    assert run.printed == ["2\n", "a   b 3\n"] and "y" not in run.namespace


def test_runner_names_the_block_that_printed_something_else(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "p.md").write_text("Intro.\n\n```python\nprint(1)\n```\n\n```text\n2\n```\n")
    monkeypatch.setattr(pages, "DOCS", tmp_path)
    with pytest.raises(AssertionError, match=r"docs/p\.md:3 printed something other"):
        pages.run_page("p.md")
    (tmp_path / "p.md").write_text("```python\n1 / 0\n```\n")
    with pytest.raises(ZeroDivisionError) as info:
        pages.run_page("p.md")
    files = [frame.filename for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "docs/p.md:1" in files  # the traceback points at the page and line
