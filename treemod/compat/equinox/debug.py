"""Equinox's `equinox.debug` over treemod (`eqx.debug` after `import treemod.compat.equinox`)."""

from treemod.debug import (
    assert_max_traces,
    backward_nan,
    breakpoint_if,
    get_num_traces,
    inspect_dce,
    store_dce,
)

__all__ = [
    "assert_max_traces",
    "backward_nan",
    "breakpoint_if",
    "get_num_traces",
    "inspect_dce",
    "store_dce",
]
