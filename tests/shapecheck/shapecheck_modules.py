"""Modules and functions with jaxtyping annotations that the shape-check tests share."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

import treemod as tm


class Linear(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]

    def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
        return self.weight @ x + self.bias


class OptionalBias(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"] | None


class BadReturn(tm.Module):
    weight: Float[Array, "out in"]

    def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
        return x * 2.0  # wrong: has size `in`, not `out`


class CustomInit(tm.Module):
    weight: Float[Array, "n n"]

    def __init__(self, n: int, m: int):
        self.weight = jnp.zeros((n, m))


class Converted(tm.Module):
    x: Float[Array, "3"] = tm.field(converter=lambda v: jnp.asarray(v, jnp.float32))


class Indices(tm.Module):
    idx: Int[Array, " n"]


class Outer(tm.Module):
    layer: Linear
    scale: Float[Array, ""]


class Batched(tm.Module):
    x: Float[Array, "*batch n"]
    y: Float[Array, "*batch n"]

    def __call__(self, z: Float[Array, "*batch n"]) -> Float[Array, "*batch"]:
        return jnp.sum(self.x * self.y * z, axis=-1)


class Scaled(tm.Module):
    weight: Float[Array, "n m"]
    scale: Float[Array, "#n 1"]


class Pair(tm.Module):
    weight: Float[Array, " n"]

    def dot(self, xs: tuple[Float[Array, " n"], Float[Array, " n"]]) -> Float[Array, ""]:
        return jnp.dot(xs[0], xs[1]) + jnp.sum(self.weight)


class Treeish(tm.Module):
    leaves: PyTree[Float[Array, " n"]]


class Always(tm.Module, shapecheck=True):
    x: Float[Array, "2"]


class Never(tm.Module, shapecheck=False):
    x: Float[Array, "2"]


class Plain(tm.Module):
    w: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w * x


@tm.shapecheck
def outer_product(x: Float[Array, " m"], y: Float[Array, " n"]) -> Float[Array, "m n"]:
    return x[:, None] * y[None, :]


@tm.shapecheck
def same_size(x: Float[Array, " n"], y: Float[Array, " n"]) -> Float[Array, " n"]:
    return x + y


@tm.shapecheck
def wrong_out(x: Float[Array, " n"]) -> Float[Array, "n n"]:
    return x


def lin(out: int = 2, inp: int = 3) -> Linear:
    return Linear(jnp.ones((out, inp)), jnp.zeros(out))


def off(fn: Callable[[], Any]) -> Any:
    """`fn()` with shape checks off (globally, inside a block)."""
    with tm.shape_checks(False):
        return fn()
