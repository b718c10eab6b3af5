"""Steady step time at the realistic batch, the libraries alternating in one process.

    python -m benchmarks.experiments.big_step_in_process \
        WORKLOAD jax,treemod,...

Each library's step is compiled and warmed up (3 steps); then 15 rounds, in alternating order,
time 5 steps each. Prints the median time per step and its range over the rounds.
"""

import importlib
import sys

import jax

from benchmarks import timing
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
        for fw in timing.round_order(frameworks, r, "alternate"):
            state = states[fw]

            def step(state=state):
                state[1], loss = state[0].step(state[1], state[2], state[3])
                return state[1], loss

            def ready(out, case=state[0]):
                case.wait(out[0])
                jax.block_until_ready(out[1])

            times[fw].append(timing.time_block(step, 5, ready=ready))
    for fw in frameworks:
        print(fw, f"{timing.spread(times[fw], scale=1e3)} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
