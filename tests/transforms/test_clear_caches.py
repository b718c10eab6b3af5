"""clear_caches drops filter_jit's compiled versions."""

from __future__ import annotations

import jax.numpy as jnp

import treemod as tm


class _Scale(tm.Module):
    w: jnp.ndarray

    @tm.filter_jit
    def apply(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.w * x


def test_clear_caches_recompiles_on_the_next_call() -> None:
    f = tm.filter_jit(lambda x: x + 1)
    model = _Scale(jnp.ones(2))
    f(jnp.ones(2))
    model.apply(jnp.ones(2))
    before = tm.debug.get_num_traces(f), tm.debug.get_num_traces(_Scale.apply)
    tm.clear_caches()
    assert f(jnp.ones(2)).tolist() == [2.0, 2.0]
    model.apply(jnp.ones(2))
    assert tm.debug.get_num_traces(f) == before[0] + 1
    assert tm.debug.get_num_traces(_Scale.apply) >= 1
