"""The code on every page under docs/concepts/ runs and prints what the page says
(tests/docs/pages.py; the other pages: test_docs_pages.py, split so that xdist spreads them).

Page-specific assertions sit in `CHECKS`: they read what running the page left behind, so each
page runs once.
"""

from __future__ import annotations

from collections.abc import Callable

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


@pytest.mark.parametrize("page", [p for p in pages.pages() if p.startswith("concepts/")])
def test_page_runs(page: str, shape_checks_restored: None) -> None:
    run = pages.run_page(page)
    check = CHECKS.get(page)
    if check is not None:
        check(run)
