"""What shape checks cost: nothing in a compiled step, a little while tracing and in eager calls.

A dispatch-bound training step (SGD on an MLP of annotated `Linear` layers, width 64, batch 8,
depth 4), compiled with `jax.jit`, three contenders:

- `plain JAX`: the same step on a dict of arrays, no modules, no checks (the floor);
- `treemod, checks on`: the model is a `treemod.Module` whose fields and `__call__` carry
  jaxtyping annotations, traced with shape checks on;
- `treemod, checks off`: the same, traced with checks off.

Contenders alternate inside each round; each sample is the mean step time over a block of steps
ending in `block_until_ready`; we report the median and range over rounds and the ratio of
medians to the floor. The checks are Python that runs while JAX traces, so the compiled steps of
`checks on` and `checks off` are the same program: their ratio should be 1 within noise.

Then where the checks do cost: tracing the step (`jax.jit(step).trace(...)`, median over
repeats), an eager (un-jitted) forward call, and the checks alone (an annotated method whose
body does nothing, and constructing an annotated layer from existing arrays; thread CPU time),
each with checks on and off.

    python -m benchmarks.shapecheck_overhead [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import timing

WIDTH, BATCH, DEPTH, LR = 64, 8, 4, 1e-3


def _build() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from jaxtyping import Array, Float

    import treemod as tm

    class Linear(tm.Module):
        weight: Float[Array, "out in"]
        bias: Float[Array, " out"]

        def __call__(self, x: Float[Array, "batch in"]) -> Float[Array, "batch out"]:
            return x @ self.weight.T + self.bias[None, :]

    class MLP(tm.Module):
        layers: list

        def __call__(self, x: Float[Array, "batch in"]) -> Float[Array, "batch out"]:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    keys = jax.random.split(jax.random.key(0), DEPTH)
    scale = 1.0 / WIDTH**0.5
    weights = [jax.random.normal(k, (WIDTH, WIDTH)) * scale for k in keys]
    model = MLP([Linear(w, jnp.zeros(WIDTH)) for w in weights])
    params = {"w": weights, "b": [jnp.zeros(WIDTH) for _ in weights]}
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jax.random.normal(jax.random.key(2), (BATCH, WIDTH))

    def tm_step(model: Any, x: Any, y: Any) -> Any:
        def loss(m: Any) -> Any:
            return jnp.mean((m(x) - y) ** 2)

        grads = jax.grad(loss)(model)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, model, grads)

    def plain_step(params: Any, x: Any, y: Any) -> Any:
        def loss(p: Any) -> Any:
            h = x
            for i, (w, b) in enumerate(zip(p["w"], p["b"], strict=True)):
                h = h @ w.T + b[None, :]
                if i < len(p["w"]) - 1:
                    h = jax.nn.relu(h)
            return jnp.mean((h - y) ** 2)

        grads = jax.grad(loss)(params)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)

    class Probe(tm.Module):
        weight: Float[Array, "out in"]
        bias: Float[Array, " out"]

        def identity(self, x: Float[Array, "batch in"]) -> Float[Array, "batch in"]:
            return x  # no JAX op: timing it times the checks alone

    return {
        "Probe": Probe,
        "Linear": Linear,
        "tm": tm,
        "jax": jax,
        "model": model,
        "params": params,
        "x": x,
        "y": y,
        "tm_step": tm_step,
        "plain_step": plain_step,
    }


def _stats(samples: list[float]) -> dict[str, float]:
    return timing.summary(samples)


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; return the results as a JSON-able dict (times in microseconds)."""
    env = _build()
    tm, jax = env["tm"], env["jax"]
    x, y = env["x"], env["y"]
    rounds, block = (5, 20) if quick else (15, 100)

    # Each contender is its own jitted function, traced (on the warm-up call) in its setting.
    steps: dict[str, tuple[Callable[..., Any], Any]] = {}
    steps["plain JAX"] = (jax.jit(env["plain_step"]), env["params"])
    for name, on in (("treemod, checks on", True), ("treemod, checks off", False)):
        fn = jax.jit(lambda m, a, b, _f=env["tm_step"]: _f(m, a, b))
        with tm.shape_checks(on):
            jax.block_until_ready(fn(env["model"], x, y))
        steps[name] = (fn, env["model"])
    jax.block_until_ready(steps["plain JAX"][0](env["params"], x, y))

    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in timing.round_order(names, r, "rotate"):
            fn, state = steps[name]
            start = time.perf_counter()
            for _ in range(block):
                state = fn(state, x, y)
            jax.block_until_ready(state)
            samples[name].append((time.perf_counter() - start) / block * 1e6)
            steps[name] = (fn, state)

    floor = statistics.median(samples["plain JAX"])
    steady = {
        name: {**_stats(s), "ratio_to_plain_jax": statistics.median(s) / floor}
        for name, s in samples.items()
    }
    on, off = (statistics.median(samples[f"treemod, checks {k}"]) for k in ("on", "off"))

    # The compiled programs are the same: lowering with checks on and off gives the same text.
    lowered = {}
    for key, flag in (("on", True), ("off", False)):
        with tm.shape_checks(flag):
            fn = jax.jit(lambda m, a, b, _f=env["tm_step"]: _f(m, a, b))
            lowered[key] = fn.lower(env["model"], x, y).as_text()

    # Where checks cost: tracing, and eager calls.
    repeats = 3 if quick else 9
    trace: dict[str, list[float]] = {"on": [], "off": []}
    eager: dict[str, list[float]] = {"on": [], "off": []}
    model = env["model"]
    for _ in range(repeats):
        for key, flag in (("on", True), ("off", False)):
            with tm.shape_checks(flag):
                fn = jax.jit(lambda m, a, b, _f=env["tm_step"]: _f(m, a, b))
                start = time.perf_counter()
                fn.trace(model, x, y)
                trace[key].append((time.perf_counter() - start) * 1e6)
                jax.block_until_ready(model(x))
                start = time.perf_counter()
                for _ in range(10):
                    out = model(x)
                jax.block_until_ready(out)
                eager[key].append((time.perf_counter() - start) / 10 * 1e6)

    # The checks alone, in eager code: a method whose body does nothing, and a construction.
    # Neither dispatches JAX work, so this thread's CPU time (`time.thread_time`) measures them
    # without the scheduling noise of a shared machine.
    w, b = env["params"]["w"][0], env["params"]["b"][0]
    probe = env["Probe"](w, b)
    n = 200 if quick else 2000
    python_cost: dict[str, dict[str, list[float]]] = {
        "call": {"on": [], "off": []},
        "construct": {"on": [], "off": []},
    }
    for _ in range(repeats):
        for key, flag in (("on", True), ("off", False)):
            with tm.shape_checks(flag):
                start = time.thread_time()
                for _ in range(n):
                    probe.identity(x)
                python_cost["call"][key].append((time.thread_time() - start) / n * 1e6)
                start = time.thread_time()
                for _ in range(n):
                    env["Linear"](w, b)
                python_cost["construct"][key].append((time.thread_time() - start) / n * 1e6)

    return {
        "checks_alone_us": {
            what: {k: _stats(v) for k, v in d.items()} for what, d in python_cost.items()
        },
        "setup": {"width": WIDTH, "batch": BATCH, "depth": DEPTH, "rounds": rounds, "block": block},
        "device": str(jax.devices()[0]),
        "steady_state_step_us": steady,
        "checks_on_over_off": on / off,
        "same_program_with_checks_on_and_off": lowered["on"] == lowered["off"],
        "trace_us": {k: _stats(v) for k, v in trace.items()},
        "eager_forward_us": {k: _stats(v) for k, v in eager.items()},
    }


def _print(results: dict[str, Any]) -> None:
    print(f"steady-state step, {results['setup']} on {results['device']}")
    print(f"{'contender':<22} {'median us':>10} {'range us':>18} {'ratio':>7}")
    for name, s in results["steady_state_step_us"].items():
        span = f"{s['min']:.1f}-{s['max']:.1f}"
        print(f"{name:<22} {s['median']:>10.1f} {span:>18} {s['ratio_to_plain_jax']:>7.3f}")
    print(f"checks on / checks off (steady state): {results['checks_on_over_off']:.3f}")
    same = results["same_program_with_checks_on_and_off"]
    print(f"same lowered program with checks on and off: {same}")
    rows = [(what, results[what]) for what in ("trace_us", "eager_forward_us")]
    rows += [(f"{what}_us (checks alone)", d) for what, d in results["checks_alone_us"].items()]
    for what, d in rows:
        on, off = d["on"], d["off"]
        print(
            f"{what}: on {on['median']:.1f} ({on['min']:.1f}-{on['max']:.1f}), "
            f"off {off['median']:.1f} ({off['min']:.1f}-{off['max']:.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, small blocks")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    results = run(quick=args.quick)
    _print(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
