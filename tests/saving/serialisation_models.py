"""The model and checks the save/load tests share: a small `Net` with a `State`, a leaf-by-leaf
bit comparison, and a tree saved to a rewound buffer."""

from __future__ import annotations

import io
import math

import jax
import jax.numpy as jnp
import numpy as np

import treemod as tm
import treemod.nn  # noqa: F401 (tm.nn)


class Block(tm.Module):
    weight: jax.Array
    bias: jax.Array | None
    act: str = tm.field(static=True, default="relu")


class Net(tm.Module):
    backbone: Block
    head: Block
    stats: tm.State
    step: int


def net(scale: float = 1.0, head_out: int = 2) -> Net:
    """A `Net` whose values scale with `scale`, its head with `head_out` outputs."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) * scale
    return Net(
        backbone=Block(jnp.asarray(w), jnp.ones(3)),
        head=Block(jnp.full((head_out, 3), scale), None),
        stats=tm.State(jnp.full(3, 2.0 * scale)),
        step=7,
    )


def assert_same(a, b) -> None:
    """Leaf by leaf: same type, dtype, shape and bits (NaN-safe), checked with NumPy."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        if tm.is_array(x):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y)
        else:
            assert x == y


def saved(tree) -> io.BytesIO:
    """`tree` saved with `tm.save` into a buffer rewound to its start."""
    buf = io.BytesIO()
    tm.save(buf, tree)
    buf.seek(0)
    return buf
