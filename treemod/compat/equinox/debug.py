"""Equinox's `equinox.debug` over treemod (`eqx.debug` after `import treemod.compat.equinox`)."""

from treemod.debug import assert_max_traces, get_num_traces

__all__ = ["assert_max_traces", "get_num_traces"]
