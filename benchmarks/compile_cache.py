"""First-call time of a training step in a fresh process: cold, against a warm persistent cache.

Each measurement is a new Python process (so nothing is cached in memory) that builds an MLP,
initialises it and an Adam optimiser (optax) as a training script does, then times the first
call of the `filter_jit` training step until its result is ready (tracing,
lowering, compilation or cache load, and execution). Three kinds of process, alternating:

- cold: no persistent cache;
- writer: `treemod.enable_compile_cache(dir)` with an empty directory (compiles and writes);
- warm: the same directory again, now holding the executable (loads instead of compiling).

We report medians and ranges, and warm / cold (target <= 0.3).

    python -m benchmarks.compile_cache [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import timing

DEPTH, WIDTH, BATCH = (int(v) for v in os.environ.get("TM_BENCH_DWB", "16,64,8").split(","))


def worker(cache_dir: str | None, warmup: bool) -> dict[str, Any]:
    """Run in the child process: time the first step; return timings and cache events."""
    import jax
    import jax.numpy as jnp
    import optax

    import treemod as tm

    events: dict[str, int] = {}
    durations: dict[str, float] = {}
    jax.monitoring.register_event_listener(
        lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1)
    )
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: durations.__setitem__(name, durations.get(name, 0.0) + secs)
    )
    if cache_dir is not None:
        tm.enable_compile_cache(cache_dir)

    class Linear(tm.Module):
        weight: jax.Array
        bias: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return x @ self.weight.T + self.bias

    class MLP(tm.Module):
        layers: list

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    keys = jax.random.split(jax.random.key(0), DEPTH + 2)
    model = MLP(
        [
            Linear(jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH**0.5, jnp.zeros(WIDTH))
            for k in keys[:DEPTH]
        ]
    )
    x = jax.random.normal(keys[-2], (BATCH, WIDTH))
    y = jax.random.normal(keys[-1], (BATCH, WIDTH))
    optimiser = optax.adam(1e-3)
    opt_state = optimiser.init(tm.filter(model, tm.is_param))

    @tm.filter_jit
    def step(m: MLP, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[MLP, Any, jax.Array]:
        loss, grads = tm.filter_value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(m)
        updates, opt_state = optimiser.update(grads, opt_state, tm.filter(m, tm.is_param))
        return tm.apply_updates(m, updates), opt_state, loss

    if warmup:  # JAX's one-off costs of a process's first trace (lazy imports, rule tables)
        w = jnp.ones((2, 2))
        tiny = jax.jit(jax.value_and_grad(lambda w: jnp.mean(jax.nn.relu(w @ w.T) ** 2)))
        _, g = tiny(w)
        tiny_opt = optax.adam(1e-3)
        jax.jit(tiny_opt.update)(g, tiny_opt.init(w), w)[0].block_until_ready()

    events.clear()
    durations.clear()
    start = time.perf_counter()
    _, _, loss = step(model, opt_state, x, y)
    loss.block_until_ready()
    first = time.perf_counter() - start
    return {
        "first_call_s": first,
        "loss": float(loss),
        "cache_hits": events.get("/jax/compilation_cache/cache_hits", 0),
        "cache_misses": events.get("/jax/compilation_cache/cache_misses", 0),
        "trace_s": durations.get("/jax/core/compile/jaxpr_trace_duration", 0.0),
        "lower_s": durations.get("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.0),
        "compile_s": durations.get("/jax/core/compile/backend_compile_duration", 0.0),
    }


def _spawn(cache_dir: str | None, warmup: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.compile_cache", "--worker"]
    if cache_dir is not None:
        cmd += ["--cache-dir", cache_dir]
    if warmup:
        cmd.append("--warmup")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(repeats: int, warmup: bool) -> dict[str, list[dict[str, Any]]]:
    """Worker results for cold, writer and warm processes, alternating."""
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "writer": [], "warm": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            runs["cold"].append(_spawn(None, warmup))
            runs["writer"].append(_spawn(cache_dir, warmup))
            runs["warm"].append(_spawn(cache_dir, warmup))
    return runs


def main(quick: bool = False) -> dict[str, Any]:
    """Measure cold, writer and warm processes; print tables and return the figures."""
    repeats = 3 if quick else 5
    print(f"first call of an Adam training step (MLP depth {DEPTH}, width {WIDTH}, batch {BATCH})")
    print(f"in a new process; {repeats} repeats, processes alternating; seconds")
    report: dict[str, Any] = {}
    for warmup in (False, True):
        runs = measure(repeats, warmup)
        label = "after a tiny warm-up step" if warmup else "as the process's first JAX trace"
        print(f"\nfirst call {label}")
        print(
            f"  {'process':8s} {'median':>7s} {'min':>7s} {'max':>7s} {'vs cold':>8s}"
            f" {'trace':>7s} {'lower':>7s} {'compile/load':>13s}"
        )
        cold = statistics.median(r["first_call_s"] for r in runs["cold"])
        rows = {}
        for name, rs in runs.items():
            xs = [r["first_call_s"] for r in rs]
            med = timing.summary(xs)["median"]
            parts = [
                statistics.median(r[k] for r in rs) for k in ("trace_s", "lower_s", "compile_s")
            ]
            rows[name] = {
                "median_s": med,
                "min_s": min(xs),
                "max_s": max(xs),
                "ratio_to_cold": med / cold,
                "trace_s": parts[0],
                "lower_s": parts[1],
                "compile_or_load_s": parts[2],
                "cache_hits": [r["cache_hits"] for r in rs],
            }
            print(
                f"  {name:8s} {med:7.3f} {min(xs):7.3f} {max(xs):7.3f} {med / cold:8.2f}"
                f" {parts[0]:7.3f} {parts[1]:7.3f} {parts[2]:13.3f}"
            )
        print(f"  warm processes' persistent-cache hits: {rows['warm']['cache_hits']}")
        report["warmup" if warmup else "first_trace"] = rows
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.cache_dir, args.warmup)))
    else:
        main(quick=args.quick)
