"""`compile_once` with rolling against JAX 0.12's `jax.jit(..., inline=jax.Inline.XLA_LATE)`.

`tm.compile_once` makes each call of a decorated method a nested `jit` of one traced program,
and `filter_jit` rolls independent calls of it into a `lax.scan`, the one construct whose body
XLA compiles once. JAX 0.12 can instead mark a nested `jit` `inline=jax.Inline.XLA_LATE`: the
call is kept in the StableHLO and XLA inlines it late (or not at all). Four contenders, each in
a fresh process per round, the rounds alternating their order:

- `rolled`: `compile_once` as treemod ships it (rolling on);
- `xla_late`: the same nested programs with `inline=jax.Inline.XLA_LATE`, rolling off;
- `nested`: the same nested programs, JAX's default inlining, rolling off;
- `inline`: the decorator taken off (every call traced and inlined: plain JAX's program);
- `rolled_late` (only with `--only`): rolling on, and the units `XLA_LATE` as well.

on two workloads: the DARTS supernet (`benchmarks/workloads/darts_treemod.py`, one bilevel
step; `MixedOp.__call__` is the unit) and the UNet of `unet_compile_once.py` (one SGD step; its
residual blocks form chains, so nothing is rolled there). Each process reports trace + lower,
XLA compile (wall and CPU), the first call, the median of the steady steps (`time_block`), and
the optimised program's size (`compiled.as_text()`: characters, instructions, fusions,
computations, calls, loops). The first round's outputs (losses, updated weights, optimiser
states, which hold the gradients) are saved and compared with `rolled`'s.

    python -m benchmarks.experiments.inline_xla_late [--workloads darts,unet] [--darts tiny]
        [--rounds 3] [--steps 20] [--only rolled,xla_late,nested,inline] [--out F] [--quick]

`--quick`: the tiny DARTS and a 2-level UNet, one round, 3 steps (to check that it runs).
Needs a JAX with `jax.Inline` (0.12 or newer) for `xla_late`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.experiments.compile_once import first_call_and_steps
from benchmarks.timing import round_order, spread

CONTENDERS = ("rolled", "xla_late", "nested", "inline")
EXTRA = ("rolled_late",)  # rolling on and the units `XLA_LATE` (inside the loops too)
PAIRS = [("rolled", c) for c in CONTENDERS[1:] + EXTRA] + [("inline", "xla_late")]
DARTS = {"tiny": (4, 2, 2, 8), "small": (4, 5, 4, 16)}  # channels, cells, batch, image
UNET = {"default": (3, 4, 8, 32, 2), "quick": (2, 2, 8, 16, 2)}  # levels, blocks, C, size, batch


def program_size(text: str) -> dict[str, int]:
    """Size of an optimised HLO module's text (`compiled.as_text()`)."""
    lines = text.splitlines()
    body = [ln for ln in lines if ln.startswith(" ") and " = " in ln]
    return {
        "hlo_chars": len(text),
        "hlo_instructions": len(body),
        "fusions": sum(1 for ln in body if re.search(r" fusion\(", ln)),
        "computations": sum(1 for ln in lines if ln and ln[0] in "%E" and ln.endswith("{")),
        "calls": sum(1 for ln in body if re.search(r" call\(", ln)),
        "loops": sum(1 for ln in body if re.search(r" while\(", ln)),
    }


def set_mode(contender: str, method_owner: type) -> None:
    """Put `compile_once` (already applied to `method_owner.__call__`) in `contender`'s mode."""
    import jax

    import treemod._transforms.compile_once as once
    from treemod._transforms.roll import UNIT_MARK

    if contender == "inline":
        method_owner.__call__ = method_owner.__call__.__wrapped__  # type: ignore[attr-defined]
        return
    if contender in ("nested", "xla_late"):
        # Rolling off: the first `compile_once` call no longer restarts the trace with rolling.
        once.unit_called = lambda: None  # type: ignore[attr-defined]
    if contender in ("xla_late", "rolled_late"):
        late = jax.Inline.XLA_LATE  # AttributeError before JAX 0.12: no such contender there
        plain_jit = jax.jit

        def jit(fun: Any = None, /, **kw: Any) -> Any:  # the units' nested `jit`s only
            if UNIT_MARK in getattr(fun, "__name__", ""):
                kw.setdefault("inline", late)
            return plain_jit(**kw) if fun is None else plain_jit(fun, **kw)

        jax.jit = jit  # type: ignore[assignment]


def measure_step(step: Any, args: tuple[Any, ...], steps: int) -> tuple[dict[str, Any], Any]:
    """`compile_once`'s first call and steps, plus the optimised program's size."""
    return first_call_and_steps(step, args, steps, compiled_size=program_size)


def darts(contender: str, size: str, steps: int) -> tuple[dict[str, Any], Any]:
    import jax
    import jax.numpy as jnp

    from benchmarks.workloads import darts_treemod as module
    from benchmarks.workloads.darts_spec import DartsConfig

    channels, cells, batch, image = DARTS[size]
    cfg = DartsConfig(channels, cells, batch, image)
    set_mode(contender, module.MixedOp)
    init_carry, step = module.make_step(cfg)
    carry = init_carry(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.image, cfg.image, 3))
    y = jnp.zeros(cfg.batch, jnp.int32)
    jax.block_until_ready((carry, x))
    return measure_step(step, (carry, x, y, x, y), steps)


def unet(contender: str, size: str, steps: int) -> tuple[dict[str, Any], Any]:
    import jax
    import jax.numpy as jnp

    import treemod as tm
    from benchmarks.experiments.unet_compile_once import ResBlock, UNet

    levels, blocks, channels, image, batch = UNET[size]
    set_mode(contender, ResBlock)
    model = UNet(levels, blocks, channels, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (batch, image, image, 1))

    @tm.filter_jit
    def step(model: UNet, x: jax.Array) -> Any:
        loss, grads = tm.filter_value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        return jax.tree.map(lambda p, g: p - 1e-2 * g, model, grads), loss, grads

    return measure_step(step, (model, x), steps)


def worker(workload: str, contender: str, size: str, steps: int, dump: str | None) -> dict:
    import jax
    import numpy as np

    record, out = (darts if workload == "darts" else unet)(contender, size, steps)
    if dump:
        leaves = [np.asarray(v) for v in jax.tree.leaves(out) if isinstance(v, jax.Array)]
        np.savez(dump, *leaves)
    return {
        "workload": workload,
        "size": size,
        "contender": contender,
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        **record,
        "load": os.getloadavg()[0],
    }


def compare(path: str, reference: str) -> dict[str, Any]:
    """How far two runs' outputs are apart, leaf by leaf.

    A leaf agrees if its largest difference is at most `1e-6 + 1e-3 * max|reference leaf|`: the
    order of float32 operations differs between the contenders (a loop, a kept call), and some
    leaves (running means of centred activations) are of the order of 1e-8, all rounding.

    Returns:
        `equal` (every leaf agrees), the largest absolute difference, and the largest
        difference relative to its leaf's scale among the leaves of scale 1e-6 or more.
    """
    import numpy as np

    with np.load(path) as a, np.load(reference) as b:
        if len(a.files) != len(b.files):
            return {"equal": False, "why": f"{len(a.files)} against {len(b.files)} leaves"}
        worst_abs = worst_rel = 0.0
        equal = True
        for name in b.files:
            x, y = a[name].astype(np.float64), b[name].astype(np.float64)
            if x.shape != y.shape:
                return {"equal": False, "why": f"{name}: {x.shape} against {y.shape}"}
            diff = float(np.max(np.abs(x - y), initial=0.0))
            scale = float(np.max(np.abs(y), initial=0.0))
            worst_abs = max(worst_abs, diff)
            if scale >= 1e-6:
                worst_rel = max(worst_rel, diff / scale)
            equal = equal and diff <= 1e-6 + 1e-3 * scale
    return {"equal": equal, "leaves": len(b.files), "max_abs_diff": worst_abs,
            "max_rel_diff": worst_rel}  # fmt: skip


def table(records: list[dict[str, Any]]) -> str:
    """Medians and ranges over rounds, per workload and contender."""
    rows = [
        "| workload | contender | first call s | compile CPU s | step ms | step CPU ms | HLO instr."
        " | fusions | computations | calls | loops |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    keys = sorted({(r["workload"], r["contender"]) for r in records if "error" not in r})
    order = {c: i for i, c in enumerate(CONTENDERS)}
    for workload, contender in sorted(keys, key=lambda k: (k[0], order.get(k[1], 9))):
        mine = [
            r for r in records if (r.get("workload"), r.get("contender")) == (workload, contender)
        ]
        first = spread([r["first_call_s"] for r in mine], digits=2)
        cpu = spread([r["compile_cpu_s"] for r in mine], digits=2)
        step = spread([r["step_ms"] for r in mine], digits=2)
        step_cpu = spread([r.get("step_cpu_ms", float("nan")) for r in mine], digits=2)
        last = mine[-1]
        rows.append(
            f"| {workload} | {contender} | {first} | {cpu} | {step} | {step_cpu}"
            f" | {last['hlo_instructions']} | {last['fusions']} | {last['computations']}"
            f" | {last['calls']} | {last['loops']} |"
        )
    return "\n".join(rows)


def load() -> str:
    """`/proc/loadavg` where there is one, else the 1, 5 and 15-minute load averages."""
    path = Path("/proc/loadavg")
    return path.read_text().strip() if path.exists() else " ".join(map(str, os.getloadavg()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="darts,unet")
    parser.add_argument("--darts", choices=sorted(DARTS), default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", default=",".join(CONTENDERS))
    parser.add_argument("--out", default=None, help="append the JSON lines and the table here")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        workload, contender = args.worker.split(":")
        print(json.dumps(worker(workload, contender, args.size, args.steps, args.dump)), flush=True)
        return
    if args.quick:
        args.rounds, args.steps, args.darts = 1, 3, "tiny"
    sizes = {"darts": args.darts, "unet": "quick" if args.quick else "default"}
    contenders = args.only.split(",")
    records: list[dict[str, Any]] = []
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    emit(f"# load before: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads.split(","):
            for r in range(args.rounds):
                for contender in round_order(contenders, r):
                    dump = str(Path(tmp) / f"{workload}-{contender}.npz") if r == 0 else None
                    cmd = [sys.executable, "-m", "benchmarks.experiments.inline_xla_late"]
                    cmd += ["--worker", f"{workload}:{contender}", "--size", sizes[workload]]
                    cmd += ["--steps", str(args.steps)] + (["--dump", dump] if dump else [])
                    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    found = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                    record = (
                        {**json.loads(found[-1]), "round": r}
                        if found
                        else {"workload": workload, "contender": contender, "round": r,
                              "error": done.stderr[-2000:]}
                    )  # fmt: skip
                    records.append(record)
                    emit(json.dumps(record))
            for reference, contender in PAIRS:
                a, b = (Path(tmp) / f"{workload}-{c}.npz" for c in (contender, reference))
                if a.exists() and b.exists():
                    result = compare(str(a), str(b))
                    emit(
                        json.dumps({"workload": workload, "pair": [contender, reference], **result})
                    )
    emit(f"# load after: {load()}")
    emit(table(records))
    if args.out:
        with Path(args.out).open("a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
