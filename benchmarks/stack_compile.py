"""First-call latency of a training step: a 48-layer `treemod.nn.Stack` against a 4-layer one.

The model is a stack of pre-norm transformer blocks (width 128, 4 heads, MLP 4x, sequence 64,
batch 8); the step is forward + backward + an optax Adam update, compiled with `jax.jit`
(parameters as arguments, the rest closed over). One measurement builds a *new* step function
and times `jax.jit(step).lower(...).compile()` (trace + lower + compile): wall time and process
CPU time (all threads; less sensitive to a loaded machine). Depths alternate within each round
after one discarded warm-up round; we report medians, ranges and the ratio of medians
48 / 4. Target: <= 1.5x (`lax.scan` traces and compiles the block once, whatever the depth).
For contrast, the same blocks unrolled in a Python loop (`Sequential`) grow linearly; that
comparison runs without `--quick`.

    python -m benchmarks.stack_compile [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import timing

WIDTH, HEADS, SEQ, BATCH = 128, 4, 64, 8


def _block_class() -> type:
    import jax

    import treemod as tm
    import treemod.nn as nn

    class Block(tm.Module):
        norm1: nn.LayerNorm
        attn: nn.MultiheadAttention
        norm2: nn.LayerNorm
        mlp: nn.MLP
        dropout: nn.Dropout

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.norm1 = nn.LayerNorm(WIDTH)
            self.attn = nn.MultiheadAttention(HEADS, WIDTH, key=k1)
            self.norm2 = nn.LayerNorm(WIDTH)
            self.mlp = nn.MLP(WIDTH, WIDTH, 4 * WIDTH, 1, activation=jax.nn.gelu, key=k2)
            self.dropout = nn.Dropout(0.1)

        def __call__(self, x: Any, *, key: Any = None) -> Any:
            k1, k2 = jax.random.split(key)
            h = self.norm1(x)
            x = x + self.dropout(self.attn(h, h, h, causal=True), key=k1)
            return x + self.dropout(self.mlp(self.norm2(x)), key=k2)

    return Block


def _model(kind: str, depth: int) -> Any:
    import jax

    import treemod.nn as nn

    block = _block_class()
    key = jax.random.key(0)
    if kind == "stack":
        return nn.Stack(block, depth, key=key)
    return nn.Sequential([block(k) for k in jax.random.split(key, depth)])


def _first_call(model: Any) -> tuple[float, float]:
    """Build a fresh step for `model`; return (wall, cpu) seconds of trace + lower + compile."""
    import jax
    import jax.numpy as jnp
    import optax

    import treemod as tm

    opt = optax.adam(1e-3)
    params, static = tm.partition(model, tm.is_inexact_array)
    opt_state = opt.init(params)
    x = jnp.zeros((BATCH, SEQ, WIDTH))
    key = jax.random.key(1)

    def step(params: Any, opt_state: Any, x: Any, key: Any) -> Any:
        def loss(p: Any) -> Any:
            return jnp.mean(tm.combine(p, static)(x, key=key) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    wall, cpu = time.perf_counter(), time.process_time()
    jax.jit(step).lower(params, opt_state, x, key).compile()
    return time.perf_counter() - wall, time.process_time() - cpu


def _summary(samples: list[float]) -> str:
    s = timing.summary(samples)
    return f"median {s['median']:7.3f}s  range [{s['min']:.3f}, {s['max']:.3f}]"


def _compare(kind: str, depths: tuple[int, int], rounds: int, log: Callable[[str], None]) -> float:
    models = {d: _model(kind, d) for d in depths}
    _first_call(models[depths[0]])  # warm-up (imports, primitive caches), discarded
    _first_call(models[depths[1]])
    wall: dict[int, list[float]] = {d: [] for d in depths}
    cpu: dict[int, list[float]] = {d: [] for d in depths}
    for r in range(rounds):
        for d in timing.round_order(depths, r, "alternate"):
            w, c = _first_call(models[d])
            wall[d].append(w)
            cpu[d].append(c)
    small, big = depths
    for d in depths:
        log(f"  {kind:10s} depth {d:2d}: wall {_summary(wall[d])};  cpu {_summary(cpu[d])}")
    ratio = statistics.median(wall[big]) / statistics.median(wall[small])
    cpu_ratio = statistics.median(cpu[big]) / statistics.median(cpu[small])
    log(
        f"  {kind}: first-call ratio {big} / {small} layers: wall {ratio:.2f}x, "
        f"cpu {cpu_ratio:.2f}x"
    )
    return ratio


def main(quick: bool = False) -> dict[str, float]:
    """Run the comparison; print and return the ratios (48 layers / 4 layers)."""
    import jax

    log = print
    rounds = 3 if quick else 7
    log(
        "Stack first-call latency (trace + lower + compile of a train step), "
        f"jax {jax.__version__}, "
        f"{jax.devices()[0].platform}; transformer blocks width {WIDTH}, {HEADS} heads, seq {SEQ}, "
        f"batch {BATCH}; {rounds} rounds, alternating."
    )
    results = {"stack": _compare("stack", (4, 48), rounds, log)}
    if not quick:
        results["unrolled"] = _compare("unrolled", (4, 48), max(3, rounds // 2), log)
    verdict = "meets" if results["stack"] <= 1.5 else "MISSES"
    log(f"Stack 48 vs 4 layers: {results['stack']:.2f}x ({verdict} the <= 1.5x target)")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no unrolled contrast")
    main(parser.parse_args().quick)
