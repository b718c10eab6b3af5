"""Apply the test suite's JAX settings (tests/conftest.py) to the doctests in `treemod/` too, and
order the files so the long ones start first (`longest_files_first`), and report to
`tests/resume.py`, which resumes a run after a worker crashed.

One doctest runs elsewhere: `breakpoint_if`'s example traces `jax.debug.breakpoint`, which
flattens the locals of every frame on the tracing stack; inside a pytest-xdist worker that stack
holds the worker's own objects, and the flattening failed with `RecursionError` in CI.
`tests/transforms/test_debug.py` runs that docstring's examples in a fresh interpreter.
"""

import pytest

from tests import resume
from tests.conftest import *  # noqa: F403
from tests.conftest import pytest_configure  # noqa: F401

RUN_IN_A_FRESH_INTERPRETER = ("treemod.debug.breakpoint_if",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    resume.deselect_finished(config, items)
    elsewhere = [item for item in items if item.name in RUN_IN_A_FRESH_INTERPRETER]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
    items[:] = longest_files_first(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    resume.record(report)


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items of files holding `heavy` or `slow` tests first, the rest after, each file's
    items together and in their order.

    With `--dist loadfile --no-loadscope-reorder` (the Makefile) the workers take whole files in
    this order. pytest-xdist's own order, most tests first, left the files with a few long
    tests (a mkdocs build, multi-process runs, a zoo family's cross-library checks) to the end,
    where one worker ran them while the other had nothing left.

    Arguments:
        items: the collected items, each file's together.

    Returns:
        The same items, the files with long tests first.
    """
    long_files = {
        item.path
        for item in items
        if item.get_closest_marker("heavy") or item.get_closest_marker("slow")
    }
    return sorted(items, key=lambda item: item.path not in long_files)
