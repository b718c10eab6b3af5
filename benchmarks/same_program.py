"""XLA compile time of each library's training-step program, compiled side by side in one process.

    python -m benchmarks.same_program [--workload mlp8] [--frameworks jax,treemod,haiku]
                                      [--rounds 15] [--quick]

The suite's first-call times come from separate fresh processes, where the XLA compile of the
same-sized program swings by 30% between repeats. This script takes the process out of the
comparison: it runs each library's first training step once, keeps the StableHLO module that
JAX hands to XLA for it, then compiles those modules again in shuffled order, `--rounds` times
each, with the persistent compilation cache off. Equal times mean the libraries gave XLA
programs of equal cost, so a difference in the suite lies elsewhere (tracing, lowering, the
process, or noise). It also prints each module's operation count.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import random
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from . import timing
from .run import unavailable
from .workloads import MODULES
from .workloads.spec import workloads


@contextlib.contextmanager
def _compiles_seen() -> Iterator[list[tuple[Any, ...]]]:
    """Within the block, the arguments of every XLA compile: (backend, module, devices, options,
    host callbacks). Every compile in JAX goes through `backend_compile_and_load`."""
    from jax._src import compiler

    seen: list[tuple[Any, ...]] = []
    original = compiler.backend_compile_and_load

    def record(*args: Any) -> Any:
        seen.append(args)
        return original(*args)

    compiler.backend_compile_and_load = record
    try:
        yield seen
    finally:
        compiler.backend_compile_and_load = original


def capture_step_modules(workload: str, frameworks: list[str], quick: bool) -> dict[str, str]:
    """The StableHLO text of each framework's first training step on `workload`."""
    import jax

    from .worker import _batch

    w = workloads(quick)[workload]
    texts: dict[str, str] = {}
    for framework in frameworks:
        case = importlib.import_module(MODULES[framework]).build(w)
        carry = case.make_carry(case.make_model(0))
        x, y = _batch(w, w.tiny_batch, case.channels_last)
        with _compiles_seen() as seen:
            carry, loss = case.step(carry, x, y)
            jax.block_until_ready(loss)
        if not seen:
            raise RuntimeError(
                f"{framework}/{workload}: the first step compiled nothing (is a persistent "
                "compilation cache on?)"
            )
        modules = [args[1].operation.get_asm(enable_debug_info=False) for args in seen]
        texts[framework] = max(modules, key=len)  # the step, not a helper computation
    return texts


def operation_count(text: str) -> int:
    """Operations a module computes with: StableHLO operations (those inside a region, such as a
    reduction's `add`, included; its `return` not) and function calls."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    count = 0

    def visit(op: Any) -> Any:
        nonlocal count
        name = op.name
        count += name == "func.call" or (
            name.startswith("stablehlo.") and name != "stablehlo.return"
        )
        return ir.WalkResult.ADVANCE

    with mlir.make_ir_context():
        ir.Module.parse(text).operation.walk(visit)
    return count


def compile_times(texts: dict[str, str], rounds: int, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per XLA compile of each module, the modules compiled in shuffled order each round."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler
    from jax._src.lib.mlir import ir

    with _compiles_seen() as seen:  # a throw-away compile: this process's devices and options
        jax.jit(lambda a: a @ a + 1.0)(jnp.ones((4, 4))).block_until_ready()
    if not seen:
        raise RuntimeError("a probe computation compiled nothing (is a persistent cache on?)")
    backend, probe, *args = seen[0]
    names = list(texts)
    times: dict[str, list[float]] = {name: [] for name in names}
    rng = random.Random(seed)
    for r in range(rounds):
        for name in timing.round_order(names, r, "shuffle", rng):
            with probe.context:
                module = ir.Module.parse(texts[name])
            t = time.perf_counter()
            compiler.backend_compile_and_load(backend, module, *args)
            times[name].append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.same_program", description=__doc__)
    parser.add_argument("--workload", default="mlp8")
    parser.add_argument("--frameworks", default="jax,treemod,haiku")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="use the tiny sizes")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # every step must really compile

    frameworks = []
    for name in args.frameworks.split(","):
        if name not in MODULES:
            parser.error(f"unknown framework {name!r}; choose from {', '.join(MODULES)}")
        reason = unavailable(name)
        if reason:
            print(f"skipping {name}: {reason}")
            continue
        frameworks.append(name)
    texts = capture_step_modules(args.workload, frameworks, args.quick)
    times = compile_times(texts, args.rounds)
    print(f"{args.workload}: XLA compile of each library's step, {args.rounds} rounds, one process")
    print(f"{'library':<10} {'ops':>6} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name in frameworks:
        t = times[name]
        print(
            f"{name:<10} {operation_count(texts[name]):>6} {statistics.median(t):>9.3f} "
            f"{min(t):>7.3f} {max(t):>7.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
