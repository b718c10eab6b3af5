"""What `tm.compile_once` changes on the DARTS supernet (issue 40): first call and steady step.

Three contenders, each in its own fresh process per round, rounds alternating: plain JAX
(`darts_jax.py`), treemod as written (`darts_treemod.py`, whose `MixedOp.__call__` is
decorated with `tm.compile_once`) and the same treemod model with the decorator taken off. Each
process reports trace + lower, XLA compile (wall and process CPU time), the program's size and
loops, and the median of the steady steps. One JSON line per process on stdout and in `--out`.

    python -m benchmarks.experiments.compile_once [--cells 5 --channels 4 --batch 4
        --image 16] [--rounds 2] [--steps 10] [--only jax,treemod,treemod-off] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.timing import time_block

CONTENDERS = ("jax", "treemod", "treemod-off")


def first_call_and_steps(
    step: Any,
    args: tuple[Any, ...],
    steps: int,
    compiled_size: Callable[[str], dict] | None = None,
) -> tuple[dict, Any]:
    """Lower and compile `step` (a `filter_jit`) for `args`, run it once, then `steps` times.

    `compiled_size`, if given, reads figures of the optimised program's text into the record.

    Returns:
        The phases' wall and CPU seconds, the lowered program's size and loops, the median and
        range of the steady steps; and the first call's output.
    """
    import jax

    w0, c0 = time.perf_counter(), time.process_time()
    lowered = step.lower(*args)
    w1, c1 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    w2, c2 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(compiled(*args))
    w3, c3 = time.perf_counter(), time.process_time()
    # Wall and process CPU time per step: on a loaded shared machine the CPU time moves less.
    pairs = [time_block(lambda: compiled(*args), cpu=True) for _ in range(steps)]
    times, cpus = [w for w, _ in pairs], [c for _, c in pairs]
    text = lowered.as_text()
    record = {
        "lower_s": w1 - w0,
        "lower_cpu_s": c1 - c0,
        "compile_s": w2 - w1,
        "compile_cpu_s": c2 - c1,
        "first_call_s": w3 - w0,
        "first_call_cpu_s": c3 - c0,
        "step_ms": 1e3 * statistics.median(times),
        "step_ms_range": [1e3 * min(times), 1e3 * max(times)],
        "step_cpu_ms": 1e3 * statistics.median(cpus),
        "stablehlo_chars": len(text),
        "loops": text.count("stablehlo.while"),
    }
    if compiled_size is not None:
        record.update(compiled_size(compiled.as_text()))
    return record, out


def measure(contender: str, cells: int, channels: int, batch: int, image: int, steps: int) -> dict:
    """One contender's first call and steps, in this process (a fresh one)."""
    import importlib

    import jax
    import jax.numpy as jnp

    from benchmarks.workloads.darts_spec import DartsConfig

    cfg = DartsConfig(channels, cells, batch, image)
    module = importlib.import_module(f"benchmarks.workloads.darts_{contender.split('-')[0]}")
    if contender == "treemod-off":
        module.MixedOp.__call__ = module.MixedOp.__call__.__wrapped__
    init_carry, step = module.make_step(cfg)
    carry = init_carry(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.image, cfg.image, 3))
    y = jnp.zeros(cfg.batch, jnp.int32)
    jax.block_until_ready((carry, x))
    record, out = first_call_and_steps(step, (carry, x, y, x, y), steps)
    return {
        "contender": contender,
        "config": [cells, channels, batch, image],
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        **record,
        "losses": [float(v) for v in out[1]],
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--image", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", default=",".join(CONTENDERS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.cells, args.channels, args.batch, args.image)
    if args.worker:
        print(json.dumps(measure(args.worker, *shape, args.steps)), flush=True)
        return
    for r in range(args.rounds):
        for contender in args.only.split(","):
            cmd = [sys.executable, "-m", "benchmarks.experiments.compile_once", "--worker"]
            cmd += [contender, "--steps", str(args.steps)]
            cmd += ["--cells", str(shape[0]), "--channels", str(shape[1])]
            cmd += ["--batch", str(shape[2]), "--image", str(shape[3])]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            line = (
                lines[-1]
                if lines
                else json.dumps({"contender": contender, "round": r, "error": done.stderr[-2000:]})
            )
            print(line, flush=True)
            if args.out:
                with Path(args.out).open("a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
