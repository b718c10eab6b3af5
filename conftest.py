"""Apply the test suite's JAX settings (tests/conftest.py) to the doctests in `treemod/` too.

One doctest runs elsewhere: `breakpoint_if`'s example traces `jax.debug.breakpoint`, which
flattens the locals of every frame on the tracing stack; inside a pytest-xdist worker that stack
holds the worker's own objects, and the flattening failed with `RecursionError` in CI.
`tests/transforms/test_debug.py` runs that docstring's examples in a fresh interpreter.
"""

import pytest

from tests.conftest import *  # noqa: F403
from tests.conftest import pytest_configure  # noqa: F401

RUN_IN_A_FRESH_INTERPRETER = ("treemod.debug.breakpoint_if",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    elsewhere = [item for item in items if item.name in RUN_IN_A_FRESH_INTERPRETER]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
