"""Where each full (generation-2) garbage collection of a fresh process falls.

    python -m benchmarks.experiments.gc_phases FRAMEWORK \
        [WORKLOAD]

Follows the suite worker's order (import, eager construction, optimiser state, first training
step) and prints, for each full collection, the phase it ran in, its duration and how many
objects generation 2 held when it started; and the objects the collector tracks between phases.
CPython 3.11 runs a full collection only once the objects promoted to generation 2 since the
last one exceed a quarter of those that survived it, so the phase a collection lands in
depends on everything the process allocated before.
"""

from __future__ import annotations

import gc
import sys
import time

log: list[list] = []
phase = ["import"]


def _on_collect(stage: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if stage == "start":
        log.append([phase[0], time.perf_counter(), len(gc.get_objects(2))])
    else:
        log[-1][1] = time.perf_counter() - log[-1][1]


gc.callbacks.append(_on_collect)

import importlib  # noqa: E402

import jax  # noqa: E402

from benchmarks.worker import _batch  # noqa: E402
from benchmarks.workloads import MODULES  # noqa: E402
from benchmarks.workloads.spec import workloads  # noqa: E402

framework = sys.argv[1]
w = workloads(False)[sys.argv[2] if len(sys.argv) > 2 else "resnet18"]
jax.config.update("jax_enable_compilation_cache", False)
case = importlib.import_module(MODULES[framework]).build(w)
tracked = {"import": len(gc.get_objects())}
phase[0] = "construction"
model = case.make_model(0)
case.wait(model)
phase[0] = "optimiser state"
carry = case.make_carry(model)
case.wait(carry)
tracked["construction"] = len(gc.get_objects())
x, y = _batch(w, w.tiny_batch, case.channels_last)
phase[0] = "first call"
carry, loss = case.step(carry, x, y)
jax.block_until_ready(loss)
tracked["first call"] = len(gc.get_objects())
collections = ", ".join(f"{p} {1e3 * d:.0f} ms (gen 2 held {n})" for p, d, n in log)
after = ", ".join(f"{p} {n}" for p, n in tracked.items())
print(f"{framework:<8} {w.name}: full collections: {collections}")
print(f"{'':<8} tracked objects after {after}")
