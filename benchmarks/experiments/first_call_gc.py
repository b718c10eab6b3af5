"""Python garbage collections during the first call of a library's training step.

    python -m benchmarks.experiments.first_call_gc \
        FRAMEWORK WORKLOAD

A fresh process builds the library's model eagerly and its optimiser state (as the suite's
worker does, without the import and construction timings), then makes the first call of the
training step and prints how long each full (generation-2) collection that ran inside that call
took, the time of all collections in it, and JAX's trace / lowering / compile durations.
"""

import gc
import importlib
import sys
import time

import jax

from benchmarks.worker import COMPILE, LOWER, TRACE, _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads


def main(framework: str, workload: str) -> None:
    events: dict[str, float] = {}
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, d, **kw: events.__setitem__(name, events.get(name, 0.0) + d)
    )
    w = workloads(False)[workload]
    case = importlib.import_module(MODULES[framework]).build(w)
    carry = case.make_carry(case.make_model(0))
    x, y = _batch(w, w.tiny_batch, case.channels_last)
    collections: list[tuple[int, float]] = []
    started = [0.0]

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - started[0]))

    events.clear()
    gc.callbacks.append(record)
    t = time.perf_counter()
    carry, loss = case.step(carry, x, y)
    jax.block_until_ready(loss)
    t = time.perf_counter() - t
    gc.callbacks.remove(record)
    full = [round(1e3 * d) for g, d in collections if g == 2]
    every = 1e3 * sum(d for _, d in collections)
    print(
        f"{framework:<8} {workload}: full collections {full} ms, all collections {every:.0f} ms; "
        f"first call {t:.3f} s, trace {events.get(TRACE, 0):.3f} lower {events.get(LOWER, 0):.3f} "
        f"compile {events.get(COMPILE, 0):.3f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
