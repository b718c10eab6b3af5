"""Placeholder main job until the digits demo lands: a small MLP on synthetic regression."""

import jax
import jax.numpy as jnp
import optax

import treemod as tm


class MLP(tm.Module):
    layers: list

    def __init__(self, sizes, *, key):
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [
            (jax.random.normal(k, (o, i)) / i**0.5, jnp.zeros(o))
            for k, i, o in zip(keys, sizes[:-1], sizes[1:], strict=True)
        ]

    def __call__(self, x):
        for w, b in self.layers[:-1]:
            x = jnp.tanh(x @ w.T + b)
        w, b = self.layers[-1]
        return x @ w.T + b


def main() -> None:
    key_data, key_model = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_data, (256, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    model = MLP([4, 32, 32, 1], key=key_model)
    optimiser = optax.adam(1e-2)
    opt_state = optimiser.init(model)

    @jax.jit
    def step(model, opt_state):
        loss, grads = jax.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        updates, opt_state = optimiser.update(grads, opt_state)
        return tm.apply_updates(model, updates), opt_state, loss

    for i in range(301):
        model, opt_state, loss = step(model, opt_state)
        if i % 50 == 0:
            print(f"step {i:3d}  loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
