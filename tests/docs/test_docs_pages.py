"""The code on every documentation page runs and prints what the page says (tests/docs/pages.py).

Page-specific assertions sit in `CHECKS`: they read what running the page left behind, so each
page runs once.
"""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import pages
import pytest

import treemod as tm


def _saving(run: pages.PageRun) -> None:
    ns = run.namespace
    # The resuming section: a model with BatchNorm, resumed from the step-2 checkpoint, trains
    # on exactly as the run that was never interrupted (its losses, computed before saving).
    losses, resumed = ns["losses"], ns["resumed"]
    assert isinstance(losses, list) and isinstance(resumed, list)
    assert len(losses) == 6 and len(resumed) == 3
    assert resumed == losses[3:]
    resumed_net, uninterrupted = ns["net"], ns["uninterrupted"]
    assert tm.tree_equal(resumed_net.norm, uninterrupted.norm)  # type: ignore[attr-defined]
    assert not tm.tree_equal(resumed_net.norm.running_mean, tm.State(jnp.zeros(16)))  # type: ignore[attr-defined]
    assert isinstance(ns["trained"].norm.running_mean, tm.State)  # type: ignore[attr-defined]


def _modules(run: pages.PageRun) -> None:
    out = run.output.splitlines()
    assert out[:3] == ["Linear(weight=f32[3,2], bias=f32[3])", "2", "[0. 0. 0.]"]
    for expected in [
        ".layers[1].bias (1,)",
        ".layers[0]  Linear      12     48",
        "total                   17     68",
        "(5, 3, 2)",
        "[0. 2.]",
        "None (1, 4)",
    ]:
        assert expected in out
    assert any(line.startswith("Cannot set Linear.bias: modules are immutable") for line in out)
    assert any(line.startswith("Bad.table is a static field holding an array") for line in out)
    assert out[out.index("(5, 3, 2)") + 2] == "2"  # traces of `apply`


CHECKS: dict[str, Callable[[pages.PageRun], None]] = {
    "concepts/saving.md": _saving,
    "concepts/modules.md": _modules,
}


@pytest.mark.parametrize("page", pages.pages())
def test_page_runs(page: str, shape_checks_restored: None) -> None:
    run = pages.run_page(page)
    check = CHECKS.get(page)
    if check is not None:
        check(run)


def _peer_cases() -> list[tuple[str, str]]:
    return [(page, peer) for page in pages.pages() for peer in pages.peers(page)]


@pytest.mark.parametrize(("page", "peer"), _peer_cases())
def test_peer_blocks_run(page: str, peer: str) -> None:
    """Other libraries' code on the pages is real: run it where the library is installed."""
    module = pages.PEER_MODULES[peer]
    if importlib.util.find_spec(module) is None:  # an optional peer, not a treemod dependency
        pytest.skip(f"{module} is not installed (pip install {module}): its blocks are not run")
    pages.run_page(page, peer)


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
