"""Host time of one training-step call: how long the call takes to return (dispatch only).

    python -m benchmarks.experiments.gpu_call_return FRAMEWORK [WORKLOAD]

On a GPU, a step whose call takes longer to return than the device takes to run it is bound by
this time. JAX dispatches asynchronously on the CPU too, so it can be measured here: the call
returns long before a 100 ms step has run. Prints the median over 30 calls, each made after
the previous step finished.
"""

from __future__ import annotations

import importlib
import sys
import time

import jax

from benchmarks import timing
from benchmarks.worker import _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads


def main() -> None:
    fw = sys.argv[1]
    w = workloads()[sys.argv[2] if len(sys.argv) > 2 else "transformer12"]
    case = importlib.import_module(MODULES[fw]).build(w)
    carry = case.make_carry(case.make_model(0))
    x, y = _batch(w, w.tiny_batch, case.channels_last)
    for _ in range(3):
        carry, loss = case.step(carry, x, y)
    jax.block_until_ready((carry, loss))
    returns, totals = [], []
    for _ in range(30):
        t = time.perf_counter()
        carry, loss = case.step(carry, x, y)
        returns.append(time.perf_counter() - t)
        jax.block_until_ready((carry, loss))
        totals.append(time.perf_counter() - t)
    print(
        f"{fw:8} {w.name}: call returns in {timing.spread(returns, scale=1e3, digits=2)} ms, "
        f"step done in {timing.summary(totals, scale=1e3)['median']:.1f} ms"
    )


if __name__ == "__main__":
    main()
