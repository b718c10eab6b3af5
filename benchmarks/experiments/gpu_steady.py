"""Steady-state step of treemod and plain JAX on the GPU, variants that isolate the slow part.

    python -m benchmarks.experiments.gpu_steady FRAMEWORK [VARIANT ...]

Prints one line per variant: the median step time over samples of asynchronously dispatched
steps. Run with XLA_FLAGS=--xla_dump_to=DIR to keep the optimised HLO for offline reading.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import time

import jax

from benchmarks import timing
from benchmarks.worker import _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads

W = workloads()
VARIANTS = {
    "tf2_dropout": dataclasses.replace(W["transformer12"], depth=2),
    "tf2_nodropout": dataclasses.replace(W["transformer12"], depth=2, dropout=0.0),
    "resnet18": W["resnet18"],
}


def main() -> None:
    fw, names = sys.argv[1], sys.argv[2:] or list(VARIANTS)
    module = importlib.import_module(MODULES[fw])
    for name in names:
        w = VARIANTS[name]
        t0 = time.perf_counter()
        case = module.build(w)
        carry = case.make_carry(case.make_model(0))
        x, y = _batch(w, w.tiny_batch, case.channels_last)
        for _ in range(3):
            carry, loss = case.step(carry, x, y)
        jax.block_until_ready(loss)
        state = [carry]

        def step(case=case, state=state, x=x, y=y):
            state[0], loss = case.step(state[0], x, y)
            return loss

        samples = [timing.time_block(step, 10) for _ in range(5)]
        print(
            f"{fw:8} {name:14} step {timing.spread(samples, scale=1e3, digits=3)} ms  "
            f"(setup+compile {time.perf_counter() - t0 - sum(samples) * 10:.1f} s) "
            f"on {jax.devices()[0].device_kind}",
            flush=True,
        )


if __name__ == "__main__":
    main()
