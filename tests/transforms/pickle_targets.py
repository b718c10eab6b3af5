"""Module-level transformed functions for tests/transforms/test_pickling.py.

They live in an importable module of their own, as in a user's training script run by a job
launcher: pickle finds each again by module and name, in this process or a spawned one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import treemod as tm


class Affine(tm.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(self.weight @ x + self.bias)

    @tm.filter_jit
    def jitted_method(self, x: jax.Array) -> jax.Array:
        return self(x)


def loss(model: Affine, x: jax.Array) -> jax.Array:
    return jnp.sum(model(x) ** 2)


@tm.filter_jit
def jitted(model: Affine, x: jax.Array) -> jax.Array:
    return model(x)


@tm.filter_grad
def grad_of_loss(model: Affine, x: jax.Array) -> jax.Array:
    return loss(model, x)


@tm.filter_value_and_grad
def value_and_grad_of_loss(model: Affine, x: jax.Array) -> jax.Array:
    return loss(model, x)


@tm.filter_vmap(in_axes=(None, 0))
def mapped(model: Affine, x: jax.Array) -> jax.Array:
    return model(x)


@tm.filter_checkpoint
def rematerialised(model: Affine, x: jax.Array) -> jax.Array:
    return model(x)


@tm.filter_custom_jvp
def scaled_tanh(x: jax.Array) -> jax.Array:
    return jnp.tanh(x)


@scaled_tanh.def_jvp
def _scaled_tanh_jvp(primals: tuple, tangents: tuple) -> tuple:
    (x,), (t,) = primals, tangents
    y = jnp.tanh(x)
    return y, (1 - y**2) * t


@tm.filter_jit
@tm.filter_grad
def jitted_grad(model: Affine, x: jax.Array) -> jax.Array:  # stacked: the outer one is named
    return loss(model, x)


@tm.filter_jacfwd
def jacobian_forward(model: Affine, x: jax.Array) -> jax.Array:
    return model(x)


@tm.filter_jacrev
def jacobian_reverse(model: Affine, x: jax.Array) -> jax.Array:
    return model(x)


@tm.filter_hessian
def hessian_of_loss(model: Affine, x: jax.Array) -> jax.Array:  # built of two wrappers
    return loss(model, x)


@tm.filter_custom_vjp
def clipped_sin(x: jax.Array) -> jax.Array:
    return jnp.sin(x)


@clipped_sin.def_fwd
def _clipped_sin_fwd(perturbed: object, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.sin(x), x


@clipped_sin.def_bwd
def _clipped_sin_bwd(x: jax.Array, ct: jax.Array, perturbed: object, _: jax.Array) -> jax.Array:
    return jnp.clip(ct * jnp.cos(x), -0.5, 0.5)


@tm.filter_pmap
def doubled(x: jax.Array) -> jax.Array:
    return 2 * x


def plain(x: jax.Array) -> jax.Array:
    return 2 * x


jitted_plain_under_another_name = tm.filter_jit(plain)


def call(function, *args):  # type: ignore[no-untyped-def]
    """Run in a spawned process: call a function that arrived there pickled."""
    return function(*args)


def grad_through(function, x):  # type: ignore[no-untyped-def]
    """Run in a spawned process: differentiate through a pickled filter_custom_vjp function."""
    return jax.grad(lambda x: jnp.sum(function(x)))(x)


def make_model() -> Affine:
    k1, k2 = jax.random.split(jax.random.key(0))
    return Affine(jax.random.normal(k1, (3, 2)), jax.random.normal(k2, (3,)))


def make_sequential() -> tm.nn.Sequential:
    """The usual model: layers and bare JAX functions (custom_jvp, jit-wrapped) in a tuple."""
    k1, k2 = jax.random.split(jax.random.key(1))
    layers = [tm.nn.Linear(2, 4, key=k1), tm.nn.BatchNorm(4), jax.nn.relu, jnp.tanh]
    return tm.nn.Sequential([*layers, tm.nn.Linear(4, 1, key=k2)])


def infer(model: tm.Module, x: jax.Array) -> jax.Array:
    return tm.nn.inference_mode(model)(x)
