"""Where the DARTS supernet's first call goes (issue 40): tracing, lowering, XLA compile.

For one library's bilevel step (`benchmarks/workloads/darts_<library>.py`) at a chosen size:
the time to trace it to a jaxpr, to lower it to StableHLO and for XLA to compile it, the
number of top-level equations, the StableHLO size and its private functions and calls. One
library per process (run them one after another: each is a cold first call).

    python -m benchmarks.experiments.darts_phases jax --cells 1 [--channels 4 --batch 2
        --image 8] [--no-compile]
"""

from __future__ import annotations

import argparse
import importlib
import time

import jax
import jax.numpy as jnp

from benchmarks.workloads.darts_spec import DartsConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("library", choices=["jax", "treemod"])
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--image", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    cfg = DartsConfig(args.channels, args.cells, args.batch, args.image)
    module = importlib.import_module(f"benchmarks.workloads.darts_{args.library}")
    init_carry, step = module.make_step(cfg)
    carry = init_carry(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.image, cfg.image, 3))
    y = jnp.zeros(cfg.batch, jnp.int32)
    t0 = time.perf_counter()
    if args.library == "jax":
        traced = step.trace(carry, x, y, x, y)
        t1 = time.perf_counter()
        lowered = traced.lower()
        eqns = str(len(traced.jaxpr.eqns))
    else:  # filter_jit traces and lowers in one call
        lowered = step.lower(carry, x, y, x, y)
        t1 = time.perf_counter()
        eqns = "-"
    t2 = time.perf_counter()
    text = lowered.as_text()
    phases = (
        f"trace {t1 - t0:.2f} s, lower {t2 - t1:.2f} s"
        if args.library == "jax"
        else f"trace + lower {t1 - t0:.2f} s"
    )
    print(
        f"{args.library} {cfg}: {phases}, {eqns} equations, "
        f"StableHLO {len(text)} chars, {text.count('func.func')} functions, "
        f"{text.count('call @')} calls",
        flush=True,
    )
    if not args.no_compile:
        lowered.compile()
        print(f"compile {time.perf_counter() - t2:.2f} s", flush=True)


if __name__ == "__main__":
    main()
