"""Does XLA:CPU compile a repeated sub-graph once if it is outlined? (issue 40)

K identical blocks (6 convolutions + tanh each, separate weights), differentiated, in four
forms: written inline; each block a call of one nested `jax.jit` (JAX lowers it to one
private function and K `func.call`s); a `lax.scan` over the stacked weights (blocks in
sequence); and, for K blocks side by side on one input, inline against `jax.vmap` over the
stacked weights. Per form: lowering and XLA compile time (one compile per round, forms
alternating), the StableHLO size, what XLA's optimised HLO keeps (calls, convolutions,
while loops), and the compiled step's run time (fusion across the boundary).

    python -m benchmarks.experiments.outlined_calls [--rounds 3] [--blocks 12] [--channels 4]
        [--size 8]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.timing import alternate, round_order, spread

DN = ("NHWC", "HWIO", "NHWC")


def block(w: jax.Array, x: jax.Array) -> jax.Array:
    for _ in range(6):
        x = jnp.tanh(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN))
    return x


def forms(k: int) -> dict[str, Callable[[jax.Array, jax.Array], jax.Array]]:
    nested = jax.jit(block)

    def inline(ws: jax.Array, x: jax.Array) -> jax.Array:
        for i in range(k):
            x = block(ws[i], x)
        return x.sum()

    def nested_jit(ws: jax.Array, x: jax.Array) -> jax.Array:
        for i in range(k):
            x = nested(ws[i], x)
        return x.sum()

    def scan(ws: jax.Array, x: jax.Array) -> jax.Array:
        x, _ = lax.scan(lambda x, w: (block(w, x), None), x, ws)
        return x.sum()

    def side_inline(ws: jax.Array, x: jax.Array) -> jax.Array:
        return sum(block(ws[i], x).sum() for i in range(k))  # type: ignore[return-value]

    def side_vmap(ws: jax.Array, x: jax.Array) -> jax.Array:
        return jax.vmap(block, (0, None))(ws, x).sum()

    return {
        "sequence: inline": inline, "sequence: nested jit": nested_jit, "sequence: scan": scan,
        "side by side: inline": side_inline, "side by side: vmap": side_vmap,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--size", type=int, default=8)
    args = parser.parse_args()
    c = args.channels
    ws = jnp.full((args.blocks, 3, 3, c, c), 0.01)
    x = jnp.ones((2, args.size, args.size, c))
    steps = forms(args.blocks)
    lower: dict[str, list[float]] = {n: [] for n in steps}
    comp: dict[str, list[float]] = {n: [] for n in steps}
    info: dict[str, str] = {}
    compiled: dict[str, Any] = {}
    for r in range(args.rounds):
        for name in round_order(list(steps), r, "alternate", None):
            t0 = time.perf_counter()
            # A new jit of a new function each round: JAX would serve a repeat from its caches.
            lowered = jax.jit(jax.grad(steps[name])).lower(ws, x)
            t1 = time.perf_counter()
            compiled[name] = lowered.compile()
            t2 = time.perf_counter()
            lower[name].append(t1 - t0)
            comp[name].append(t2 - t1)
            hlo = compiled[name].as_text()
            info[name] = (
                f"StableHLO {len(lowered.as_text())} chars, {lowered.as_text().count('call @')} "
                f"calls; optimised HLO {hlo.count(' call(')} calls, "
                f"{hlo.count('convolution(')} convolutions, {hlo.count(' while(')} while loops"
            )
    run = alternate({n: (lambda f=f: f(ws, x)) for n, f in compiled.items()}, 15, block=5)
    print(f"{args.blocks} blocks, {args.rounds} rounds; median [min-max]")
    for name in steps:
        print(
            f"{name}: lower {spread(lower[name])} s, compile {spread(comp[name])} s, "
            f"step {spread(run[name], scale=1e3, digits=2)} ms; {info[name]}"
        )


if __name__ == "__main__":
    main()
