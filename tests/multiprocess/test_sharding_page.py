"""docs/sharding.md's multi-process recipe runs: its `<!-- multiprocess: N -->` blocks, in page
order, as one program in N real processes with 4 fake CPU devices each (8 in all), and each
process prints what the `text` block after each python block shows.

What the recipe prints compares FSDP fine-tuning of a zoo Llama across the processes with the
same steps on one device (losses and weights within 1e-5), and each device's bytes of
parameters, gradients and Adam state with an eighth of the total (from the arrays' shards and
XLA's memory analysis of the step).
"""

from __future__ import annotations

import pytest

from docs import pages
from multiprocess import harness

pytestmark = [pytest.mark.heavy, pytest.mark.xdist_group("multiprocess")]

pytest.importorskip("optax")  # the recipe's optimiser

PAGE = "sharding.md"
DEVICES = 4


def _program() -> tuple[int, str, list[str]]:
    """The process count the blocks want, the blocks as one script, and the lines they print."""
    counts, code, expected = set(), [], []
    for block in pages.blocks(PAGE):
        if block.kind.startswith("multiprocess:"):
            counts.add(int(block.kind.removeprefix("multiprocess:")))
            code.append(f"# {block.where}\n{block.code}")
            expected += (block.expected or "").splitlines()
    assert len(counts) == 1, f"{PAGE}: the multi-process blocks disagree on the count {counts}"
    return counts.pop(), "\n".join(code), expected


def test_the_page_has_a_multiprocess_recipe_with_outputs() -> None:
    count, code, expected = _program()
    assert count == 2
    assert code.count(f"# docs/{PAGE}:") >= 3
    assert "True True" in expected  # the comparison with one device is shown


def test_fsdp_recipe_runs_on_two_processes_of_four_devices() -> None:
    count, code, expected = _program()
    finished = harness.run_script(
        code, num_processes=count, devices_per_process=DEVICES, timeout=400
    )
    for f in finished:
        printed = f.printed()
        assert printed == expected, f"process {f.process_id} printed {printed}\n{f.stderr}"
