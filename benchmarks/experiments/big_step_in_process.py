"""Steady step time at the realistic batch, the libraries alternating in one process.

    python -m benchmarks.experiments.big_step_in_process \
        WORKLOAD jax,treemod,...

Each library's step is compiled and warmed up (3 steps); then 15 rounds, in alternating order,
time 5 steps each. Prints the median time per step and its range over the rounds.
"""

import importlib
import statistics
import sys
import time

import jax

from benchmarks.worker import _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads


def main(workload: str, frameworks: list[str]) -> None:
    w = workloads(False)[workload]
    states = {}
    for fw in frameworks:
        case = importlib.import_module(MODULES[fw]).build(w)
        carry = case.make_carry(case.make_model(0))
        x, y = _batch(w, w.big_batch, case.channels_last)
        for _ in range(3):
            carry, loss = case.step(carry, x, y)
        case.wait(carry)
        states[fw] = [case, carry, x, y]
    times: dict[str, list[float]] = {fw: [] for fw in frameworks}
    for r in range(15):
        for fw in frameworks if r % 2 else frameworks[::-1]:
            case, carry, x, y = states[fw]
            t = time.perf_counter()
            for _ in range(5):
                carry, loss = case.step(carry, x, y)
            case.wait(carry)
            jax.block_until_ready(loss)
            times[fw].append((time.perf_counter() - t) / 5)
            states[fw][1] = carry
    for fw in frameworks:
        ms = [1e3 * t for t in times[fw]]
        print(fw, f"{statistics.median(ms):.1f} ms [{min(ms):.1f}-{max(ms):.1f}]")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
