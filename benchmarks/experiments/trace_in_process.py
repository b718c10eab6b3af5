"""Trace and lowering time of each library's training step, in one process, in shuffled rounds.

    python -m benchmarks.experiments.trace_in_process \
        WORKLOAD ROUNDS jax,treemod,...

The suite measures tracing once per fresh process, where a garbage collection or a slow phase
of the machine can land in one library's call and not another's. Here each library's step is
built once; then, round after round in shuffled order, JAX's caches are cleared, a full
collection is run, and the step is called with XLA's compiler replaced by a function that
stops the call, so only tracing and lowering run (timed by `jax.monitoring`). Round 0 warms
up each library's own Python-level caches and is not counted.
"""

import gc
import importlib
import random
import sys
from typing import Any

import jax
from jax._src import compiler

from benchmarks import timing
from benchmarks.worker import LOWER, TRACE, _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads


class _Stop(Exception):
    pass


def _stop(*args: Any, **kwargs: Any) -> Any:
    raise _Stop


def main(workload: str, rounds: int, frameworks: list[str]) -> None:
    events: dict[str, float] = {}
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, d, **kw: events.__setitem__(name, events.get(name, 0.0) + d)
    )
    w = workloads(False)[workload]
    cases = {}
    for fw in frameworks:
        case = importlib.import_module(MODULES[fw]).build(w)
        carry = case.make_carry(case.make_model(0))
        cases[fw] = (case, carry, *_batch(w, w.tiny_batch, case.channels_last))
    compiler.backend_compile_and_load = _stop
    times: dict[str, list[tuple[float, float]]] = {fw: [] for fw in frameworks}
    rng = random.Random(0)
    for r in range(rounds + 1):
        for fw in timing.round_order(frameworks, r, "shuffle", rng):
            case, carry, x, y = cases[fw]
            jax.clear_caches()
            gc.collect()
            events.clear()
            try:
                case.step(carry, x, y)
            except _Stop:
                pass
            if r:
                times[fw].append((events.get(TRACE, 0.0), events.get(LOWER, 0.0)))
    print(f"{workload}: trace / lowering of the step, {rounds} rounds, one process")
    print("library    trace ms, median [min-max]     lowering ms, median [min-max]")
    for fw in frameworks:
        cols = []
        for i in (0, 1):
            v = [t[i] for t in times[fw]]
            cols.append(f"{timing.spread(v, scale=1e3):>7}")
        print(f"{fw:<10} {cols[0]:<30} {cols[1]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))
