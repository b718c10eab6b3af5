"""Dispatch overhead of `filter_jit` against `jax.jit` (the floor), Equinox and Flax NNX (in
its default graph mode and in tree mode, `graph=False`).

A dispatch-bound training step (SGD on an MLP, width 64, batch 8) at depth 8 and 64. The model
holds one non-array leaf, a float like Dropout's `p`, as real models do (a model of arrays alone
hid a 10x slower dispatch path from this benchmark once). Every contender runs the same step;
the floor is `jax.jit` on parameters partitioned once, before the loop (what a hand-optimised
JAX program does). Contenders alternate inside each round; each sample is the mean step time
over a block of steps ending in `block_until_ready`; we report the median and range over
rounds, and the median over rounds of each contender's time divided by the floor's time in the
same round (pairing cancels drifts in machine load).

Second part: asynchronous dispatch. A ~200 ms computation is called through each wrapper and
we time how long the call takes to return (a non-blocking wrapper returns in well under 1 ms).

    python -m benchmarks.dispatch [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import timing

WIDTH, BATCH, LR = 64, 8, 1e-3


def _treemod_contenders(depth: int) -> dict[str, Callable[[], Callable[[], Any]]]:
    import jax
    import jax.numpy as jnp

    import treemod as tm

    class Linear(tm.Module):
        weight: jax.Array
        bias: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return x @ self.weight.T + self.bias

    class MLP(tm.Module):
        layers: list
        dropout_p: float = 0.0  # a non-array leaf, as Dropout's p
        activation: Callable = tm.field(static=True, default=jax.nn.relu)

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = self.activation(layer(x)) * (1.0 - self.dropout_p)
            return self.layers[-1](x)

    keys = jax.random.split(jax.random.key(0), depth)
    scale = 1.0 / WIDTH**0.5
    model = MLP(
        [Linear(jax.random.normal(k, (WIDTH, WIDTH)) * scale, jnp.zeros(WIDTH)) for k in keys]
    )
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jax.random.normal(jax.random.key(2), (BATCH, WIDTH))

    def loss_fn(m: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((m(x) - y) ** 2)

    def sgd_step(m: MLP, x: jax.Array, y: jax.Array) -> tuple[MLP, jax.Array]:
        loss, grads = tm.filter_value_and_grad(loss_fn)(m, x, y)
        updates = jax.tree_util.tree_map(lambda g: -LR * g, grads)
        return tm.apply_updates(m, updates), loss

    def make_treemod() -> Callable[[], Any]:
        step = tm.filter_jit(sgd_step)
        state = [model]

        def run() -> Any:
            state[0], loss = step(state[0], x, y)
            return loss

        return run

    def make_floor() -> Callable[[], Any]:
        params, static = tm.partition(model, tm.is_array)

        @jax.jit
        def step(p: Any, x: jax.Array, y: jax.Array) -> Any:
            new_model, loss = sgd_step(tm.combine(p, static), x, y)
            return tm.filter(new_model, tm.is_array), loss

        state = [params]

        def run() -> Any:
            state[0], loss = step(state[0], x, y)
            return loss

        return run

    return {"jax.jit (floor)": make_floor, "treemod.filter_jit": make_treemod}


def _equinox_contender(depth: int) -> dict[str, Callable[[], Callable[[], Any]]]:
    try:
        import equinox as eqx
    except ImportError:
        return {}
    import jax
    import jax.numpy as jnp

    class Linear(eqx.Module):
        weight: jax.Array
        bias: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return x @ self.weight.T + self.bias

    class MLP(eqx.Module):
        layers: list
        dropout_p: float = 0.0  # a non-array leaf, as Dropout's p
        activation: Callable = eqx.field(static=True, default=jax.nn.relu)

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = self.activation(layer(x)) * (1.0 - self.dropout_p)
            return self.layers[-1](x)

    keys = jax.random.split(jax.random.key(0), depth)
    scale = 1.0 / WIDTH**0.5
    model = MLP(
        [Linear(jax.random.normal(k, (WIDTH, WIDTH)) * scale, jnp.zeros(WIDTH)) for k in keys]
    )
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jax.random.normal(jax.random.key(2), (BATCH, WIDTH))

    @eqx.filter_jit
    def step(m: MLP, x: jax.Array, y: jax.Array) -> Any:
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(m)
        updates = jax.tree_util.tree_map(lambda g: -LR * g, grads)
        return eqx.apply_updates(m, updates), loss

    def make() -> Callable[[], Any]:
        state = [model]

        def run() -> Any:
            state[0], loss = step(state[0], x, y)
            return loss

        return run

    return {"equinox.filter_jit": make}


def _nnx_contender(depth: int, graph: bool = True) -> dict[str, Callable[[], Callable[[], Any]]]:
    """Flax NNX's step through `nnx.jit`, in graph mode or (`graph=False`) tree mode, where
    `nnx.value_and_grad` differentiates its whole argument (here all Params)."""
    try:
        from flax import nnx
    except ImportError:
        return {}
    import jax
    import jax.numpy as jnp

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            layers = [nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(depth)]
            self.layers = nnx.List(layers) if hasattr(nnx, "List") else layers

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in list(self.layers)[:-1]:
                x = jax.nn.relu(layer(x))
            return list(self.layers)[-1](x)

    model = MLP(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jax.random.normal(jax.random.key(2), (BATCH, WIDTH))

    @nnx.jit(graph=graph)
    def step(m: MLP, x: jax.Array, y: jax.Array) -> Any:
        value_and_grad = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2), graph=graph)
        loss, grads = value_and_grad(m)
        params = nnx.state(m, nnx.Param, graph=graph)
        grads = nnx.state(grads, nnx.Param, graph=graph)
        nnx.update(m, jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads))
        return loss

    def make() -> Callable[[], Any]:
        def run() -> Any:
            return step(model, x, y)

        return run

    return {"flax nnx.jit" if graph else "nnx.jit (tree mode)": make}


def _time_block(run: Callable[[], Any], steps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step over `steps` steps, ending when the result is ready."""
    wall_cpu: tuple[float, float] = timing.time_block(
        run, steps, ready=lambda out: out.block_until_ready(), cpu=True
    )
    return wall_cpu


def measure_depth(depth: int, rounds: int, steps: int) -> dict[str, list[tuple[float, float]]]:
    """Per-step (wall, CPU) seconds for each contender, `rounds` samples, contenders alternating."""
    makers = {
        **_treemod_contenders(depth),
        **_equinox_contender(depth),
        **_nnx_contender(depth),
        **_nnx_contender(depth, graph=False),
    }
    runs = {name: make() for name, make in makers.items()}
    for run in runs.values():  # compile and warm up
        _time_block(run, 3)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in timing.round_order(list(runs), r, "alternate"):
            samples[name].append(_time_block(runs[name], steps))
    return samples


def measure_nonblocking(repeats: int) -> dict[str, tuple[float, float]]:
    """(call-return time, blocked time) in ms of a ~200 ms computation per wrapper."""
    import jax
    import jax.numpy as jnp

    import treemod as tm

    n = 1024
    w = jax.random.normal(jax.random.key(0), (n, n)) / n**0.5

    def make_work(iters: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
        def work(w: jax.Array, x: jax.Array) -> jax.Array:
            return jax.lax.fori_loop(0, iters, lambda i, x: jnp.tanh(w @ x), x)

        return work

    x = jnp.ones((n, n))
    iters = 4
    while True:  # calibrate to ~200 ms
        f = jax.jit(make_work(iters))
        f(w, x).block_until_ready()
        start = time.perf_counter()
        f(w, x).block_until_ready()
        took = time.perf_counter() - start
        if took > 0.15 or iters > 4096:
            break
        iters = int(iters * max(2.0, 0.2 / max(took, 1e-4)))
    work = make_work(iters)
    wrappers: dict[str, Callable[..., Any]] = {
        "jax.jit": jax.jit(work),
        "treemod.filter_jit": tm.filter_jit(work),
    }
    try:
        import equinox as eqx

        wrappers["equinox.filter_jit"] = eqx.filter_jit(work)
    except ImportError:
        pass
    results: dict[str, tuple[float, float]] = {}
    for name, f in wrappers.items():
        f(w, x).block_until_ready()
        calls, totals = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            out = f(w, x)
            returned = time.perf_counter()
            out.block_until_ready()
            calls.append(returned - start)
            totals.append(time.perf_counter() - start)
        results[name] = (statistics.median(calls) * 1e3, statistics.median(totals) * 1e3)
    return results


def main(quick: bool = False) -> dict[str, Any]:
    """Run both parts, print tables, and return the figures (for a benchmark suite)."""
    rounds, steps = (9, 30) if quick else (41, 50)
    report: dict[str, Any] = {"dispatch": {}, "nonblocking": {}}
    print(f"dispatch-bound SGD step, MLP width {WIDTH}, batch {BATCH}")
    print(f"{rounds} rounds x {steps} steps, contenders alternating; per-step microseconds")
    print("(wall clock: median, min, max; ratio: median over rounds of contender / floor in the")
    print(" same round; then the same for process CPU time)")
    for depth in (8, 64):
        samples = measure_depth(depth, rounds, steps)
        floor_pairs = samples["jax.jit (floor)"]
        print(f"\ndepth {depth}")
        print(
            f"  {'contender':20s} {'median':>8s} {'min':>8s} {'max':>8s} {'ratio':>6s}"
            f" {'CPU med':>8s} {'CPU ratio':>9s}"
        )
        rows = {}
        for name, pairs in samples.items():
            xs = [w for w, _ in pairs]
            cpus = [c for _, c in pairs]
            # Ratios are paired by round (the floor ran next to the contender), then the median
            # is taken: this cancels most of the drift in machine load between rounds.
            ratio = timing.paired_ratio(xs, [f for f, _ in floor_pairs])
            cpu_ratio = timing.paired_ratio(cpus, [f for _, f in floor_pairs])
            med, cpu = statistics.median(xs), statistics.median(cpus)
            rows[name] = {
                **timing.summary(xs, scale=1e6, unit="us"),
                "ratio_to_floor": ratio,
                "cpu_median_us": cpu * 1e6,
                "cpu_ratio_to_floor": cpu_ratio,
            }
            print(
                f"  {name:20s} {med * 1e6:8.1f} {min(xs) * 1e6:8.1f} {max(xs) * 1e6:8.1f}"
                f" {ratio:6.2f} {cpu * 1e6:8.1f} {cpu_ratio:9.2f}"
            )
        report["dispatch"][depth] = rows
    print("\nnon-blocking dispatch: a ~200 ms computation; time until the call returns")
    print(f"  {'wrapper':22s} {'call returns (ms)':>18s} {'result ready (ms)':>18s}")
    for name, (call_ms, total_ms) in measure_nonblocking(3 if quick else 7).items():
        report["nonblocking"][name] = {"call_ms": call_ms, "total_ms": total_ms}
        print(f"  {name:22s} {call_ms:18.2f} {total_ms:18.1f}")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    main(quick=parser.parse_args().quick)
