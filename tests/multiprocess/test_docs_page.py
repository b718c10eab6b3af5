"""The docs page on many hosts runs: its `<!-- multiprocess: N -->` blocks, in page order, as one
program in N real processes (2 fake CPU devices each), launched like a SLURM job step.

The common docs runner (tests/docs/pages.py) leaves those blocks to this test.
"""

from __future__ import annotations

import re

import pytest

from docs import pages
from multiprocess import harness

# One xdist worker runs them all (`make test`: -n 2 --dist loadgroup), so each run starts once.
pytestmark = pytest.mark.heavy  # processes talking through jax.distributed

pytest.importorskip("orbax.checkpoint")  # optional dependencies the page uses
pytest.importorskip("optax")

PAGE = "concepts/many-hosts.md"
_MARKER = re.compile(r"<!--\s*multiprocess:\s*(\d+)\s*-->\s*$")


def _program(page: str) -> tuple[int, str]:
    """How many processes the page's multi-process blocks want, and the blocks as one script."""
    counts = set()
    code = []
    for block in pages.blocks(page):
        if block.kind.startswith("multiprocess:"):
            counts.add(int(block.kind.removeprefix("multiprocess:")))
            code.append(f"# {block.where}\n{block.code}")
    assert len(counts) == 1, f"{page}: the multi-process blocks disagree on the count {counts}"
    return counts.pop(), "\n".join(code)


def test_every_multiprocess_block_is_found() -> None:
    text = (pages.DOCS / PAGE).read_text()
    markers = [m for line in text.splitlines() if (m := _MARKER.search(line))]
    count, code = _program(PAGE)
    assert len(markers) == code.count("# docs/concepts/many-hosts.md:") >= 4
    assert count == 2


def test_many_hosts_page_runs_in_several_processes(tmp_path: pytest.TempPathFactory) -> None:
    count, code = _program(PAGE)
    finished = harness.run_script(code, num_processes=count, devices_per_process=2, timeout=300)
    for f in finished:
        printed = f.printed()
        assert printed == ["False", "[4, 5]", "5"], f"process {f.process_id} printed {printed}"
