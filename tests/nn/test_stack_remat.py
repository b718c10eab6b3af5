"""Remat policies: `Stack(..., remat=...)` and `filter_checkpoint(policy=...)` save exactly
what the policy names (read from `jax.ad_checkpoint.print_saved_residuals`), with gradients
equal to plain JAX's."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name, print_saved_residuals

import treemod as tm
import treemod.nn as nn

WIDTH, HIDDEN, DEPTH, BATCH = 16, 32, 12, 4


class Block(tm.Module):
    up: nn.Linear
    down: nn.Linear

    def __init__(self, key: Any) -> None:
        k1, k2 = jax.random.split(key)
        self.up = nn.Linear(WIDTH, HIDDEN, key=k1)
        self.down = nn.Linear(HIDDEN, WIDTH, key=k2)

    def __call__(self, x: Any) -> Any:
        h = checkpoint_name(jnp.tanh(self.up(x)), "hidden")
        return x + jnp.sin(self.down(h))


def _residuals(fn: Any, *args: Any) -> list[str]:
    """The saved residuals that are not arguments, as `print_saved_residuals` lists them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    return [line for line in out.getvalue().splitlines() if "from the argument" not in line]


def _plain_loss(params: list[dict[str, Any]], x: Any) -> Any:
    for p in params:  # the same blocks in plain JAX, unrolled
        h = jnp.tanh(x @ p["up_w"].T + p["up_b"][None])
        x = x + jnp.sin(h @ p["down_w"].T + p["down_b"][None])
    return jnp.sum(x**2)


@pytest.mark.parametrize(
    ("remat", "saved"),
    [
        # Without remat JAX's autodiff decides (jax 0.10 keeps one more hidden value than 0.12):
        # at least the inputs and both hidden values per layer.
        (False, None),
        (True, ["f32[12,4,16]"]),  # each layer's input only
        ("nothing", ["f32[12,4,16]"]),
        (["hidden"], ["f32[12,4,32]", "f32[12,4,16]"]),  # the named value, and the inputs
        (jax.checkpoint_policies.save_only_these_names("hidden"), ["f32[12,4,32]", "f32[12,4,16]"]),
    ],
)
def test_stack_saves_what_the_policy_names_and_gradients_are_plain_jaxs(
    remat: Any, saved: list[str] | None
) -> None:
    stack = nn.Stack(Block, DEPTH, key=jax.random.key(0), remat=remat)
    arrays, static = tm.partition(stack, tm.is_array)
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))

    def loss(arrays: Any, x: Any) -> Any:
        return jnp.sum(tm.combine(arrays, static)(x) ** 2)

    lines = [line for line in _residuals(loss, arrays, x) if "output of scan" in line]
    kinds = [line.split()[0] for line in lines]
    if saved is None:
        assert kinds.count("f32[12,4,32]") >= 2 and "f32[12,4,16]" in kinds, lines
    else:
        assert kinds == saved, lines
    params = [
        {"up_w": b.up.weight, "up_b": b.up.bias, "down_w": b.down.weight, "down_b": b.down.bias}
        for b in stack
    ]
    want = jax.grad(_plain_loss)(params, x)
    got = jax.grad(loss)(arrays, x)
    for i, p in enumerate(want):
        np.testing.assert_allclose(got.layers.up.weight[i], p["up_w"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.layers.down.bias[i], p["down_b"], rtol=1e-4, atol=1e-5)


def test_filter_checkpoint_saves_the_named_values_only() -> None:
    block = Block(jax.random.key(0))
    x = jnp.ones((BATCH, WIDTH))
    for policy, named in ((["hidden"], 1), ("nothing", 0), ("dots", 0)):
        fn = tm.filter_checkpoint(block, policy=policy)
        lines = _residuals(lambda x, fn=fn: jnp.sum(fn(x)), x)
        assert sum("named 'hidden'" in line for line in lines) == named, (policy, lines)
    dots = _residuals(lambda x: jnp.sum(tm.filter_checkpoint(block, policy="dots")(x)), x)
    # The weights are constants here (closed over); of the values, only the matmuls' are kept.
    kept = [line.split()[0] for line in dots if "from a constant" not in line]
    assert kept == ["f32[4,32]", "f32[4,16]"], dots


def test_remat_cuts_a_twelve_layer_steps_temporaries_to_a_quarter() -> None:
    big = 512

    class Wide(tm.Module):
        up: nn.Linear
        down: nn.Linear

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.up, self.down = nn.Linear(big, 4 * big, key=k1), nn.Linear(4 * big, big, key=k2)

        def __call__(self, x: Any) -> Any:
            return x + self.down(jnp.tanh(self.up(x)))

    x = jnp.ones((1024, big))
    temps = {}
    for remat in (False, True):
        stack = tm.filter_eval_shape(nn.Stack, Wide, DEPTH, key=jax.random.key(0), remat=remat)
        arrays, static = tm.partition(stack, tm.is_array)

        def loss(a: Any, x: Any, static: Any = static) -> Any:
            return jnp.sum(tm.combine(a, static)(x) ** 2)

        step = jax.jit(jax.grad(loss))
        stats = step.lower(arrays, x).compile().memory_analysis()
        assert stats is not None
        temps[remat] = stats.temp_size_in_bytes
    assert temps[True] <= temps[False] / 4, temps


def test_bad_policies_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"Stack: `remat`: the remat policy 'dot'"):
        nn.Stack(Block, 2, key=jax.random.key(0), remat="dot")
    with pytest.raises(ValueError, match=r"filter_checkpoint: a remat policy.*got 3"):
        tm.filter_checkpoint(Block(jax.random.key(0)), policy=3)  # type: ignore[arg-type]
