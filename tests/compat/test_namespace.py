"""The compat namespace re-exports treemod's public API under Equinox's module layout."""

import treemod
import treemod.compat.equinox as eqx
import treemod.nn


def test_every_treemod_name_is_reexported() -> None:
    for name in treemod.__all__:
        assert name in eqx.__all__, name
        assert hasattr(eqx, name), name


def test_every_treemod_nn_name_is_reexported() -> None:
    for name in treemod.nn.__all__:
        assert name in eqx.nn.__all__, name
        assert hasattr(eqx.nn, name), name


def test_subnamespaces() -> None:
    assert eqx.debug.assert_max_traces is not None
    assert eqx.filter_jit is treemod.filter_jit
