"""Everyday paths: re-wrapped filter_jit, eager layer calls, import time, ahead-of-time steps.

Four measurements, each against Equinox and plain JAX in the same run where they have one:

- `rewrap`: `filter_jit(f)(model, x)` written inline, a fresh wrapper of the same `f` each call
  (notebooks, evaluation helpers), against `eqx.filter_jit(f)(model, x)` and
  `jax.jit(f)(params, x)`, and the same call through one decorated wrapper (the floor).
- `eager`: un-jitted layer calls (shape checks on, treemod's default, and off) against the
  same Equinox layer and the same arithmetic in plain `jax.numpy`.
- `import`: `import treemod` (and `import equinox`) after `import jax`, in fresh processes
  (wall and CPU time), with bytecode written first as an installed package has it.
- `aot`: the first training step of a benchmark workload in a new process: cold (trace, lower,
  compile, run) against `treemod.load_compiled` of a step saved by `save_compiled` (load, run),
  with the load split into reading the file and deserialising the executable; then three more
  steps of each (the saved program is compiled with `save_compiled`'s load-fast options).

Contenders alternate inside each round; each sample is the mean per-call time over a block of
calls ending in `block_until_ready`; we report the median and range over rounds, and ratios of
medians. Results go to one JSON file (`--json`, default benchmarks/everyday.json).

    python -m benchmarks.everyday [--quick] [--only rewrap,eager,import,aot] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import timing

ROOT = Path(__file__).resolve().parent.parent


def _alternate(cases: dict[str, Callable[[], Any]], rounds: int, block: int) -> dict[str, Any]:
    """Median and range of the per-call time of each case (microseconds), the cases taking
    turns in every round."""
    samples = timing.alternate(cases, rounds, block=block, order="fixed")
    return {name: timing.summary(s, scale=1e6, unit="us") for name, s in samples.items()}


def _ratios(results: dict[str, Any], pairs: dict[str, tuple[str, str]]) -> dict[str, float]:
    return {
        label: results[a]["median_us"] / results[b]["median_us"] for label, (a, b) in pairs.items()
    }


# ------------------------------------------------------------------------------ rewrap


def bench_rewrap(quick: bool) -> dict[str, Any]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import treemod as tm

    width = 64
    tm_model = tm.nn.MLP(width, width, width, 2, key=jax.random.key(0))
    eqx_model = eqx.nn.MLP(width, width, width, 2, key=jax.random.key(0))
    params = jax.tree_util.tree_leaves(eqx.filter(eqx_model, eqx.is_array))
    x = jnp.ones((8, width))

    def apply(model: Any, x: Any) -> Any:
        return model(x)

    def eqx_apply(model: Any, x: Any) -> Any:
        return jax.vmap(model)(x)

    def plain(params: list[Any], x: Any) -> Any:
        for i in range(0, len(params) - 2, 2):
            x = jax.nn.relu(x @ params[i].T + params[i + 1])
        return x @ params[-2].T + params[-1]

    decorated = tm.filter_jit(apply)
    cases = {
        "treemod_rewrap": lambda: tm.filter_jit(apply)(tm_model, x),
        "equinox_rewrap": lambda: eqx.filter_jit(eqx_apply)(eqx_model, x),
        "jax_rewrap": lambda: jax.jit(plain)(params, x),
        "treemod_decorated": lambda: decorated(tm_model, x),
    }
    results = _alternate(cases, rounds=5 if quick else 15, block=50 if quick else 200)
    traces = tm.debug.get_num_traces(tm.filter_jit(apply))
    return {
        "per_call": results,
        "traces_of_apply": traces,
        "ratios": _ratios(
            results,
            {
                "treemod_rewrap / equinox_rewrap": ("treemod_rewrap", "equinox_rewrap"),
                "treemod_rewrap / jax_rewrap": ("treemod_rewrap", "jax_rewrap"),
                "treemod_rewrap / treemod_decorated": ("treemod_rewrap", "treemod_decorated"),
            },
        ),
    }


# ------------------------------------------------------------------------------ eager layers


def _layers() -> dict[str, tuple[Any, Any, Any, Callable[[], Any]]]:
    """name -> (treemod layer, Equinox layer, input, plain-JAX call)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    from jax import lax

    import treemod as tm

    key = jax.random.key(0)
    out: dict[str, Any] = {}
    tl, el = tm.nn.Linear(64, 64, key=key), eqx.nn.Linear(64, 64, key=key)
    x = jnp.ones((64,))
    w, b = el.weight, el.bias
    out["Linear 64->64, x (64,)"] = (tl, el, x, lambda: w @ x + b)
    tc, ec = tm.nn.Conv2d(3, 16, 3, key=key), eqx.nn.Conv2d(3, 16, 3, key=key)
    xi = jnp.ones((3, 32, 32))
    cw, cb = ec.weight, ec.bias

    def conv() -> Any:
        y = lax.conv_general_dilated(xi[None], cw, (1, 1), "VALID")[0]
        return y + cb

    out["Conv2d 3->16 3x3, x (3,32,32)"] = (tc, ec, xi, conv)
    tn, en = tm.nn.LayerNorm(64), eqx.nn.LayerNorm(64)

    def norm() -> Any:
        mean = jnp.mean(x)
        var = jnp.var(x)
        return (x - mean) * lax.rsqrt(var + 1e-5) * en.weight + en.bias

    out["LayerNorm 64, x (64,)"] = (tn, en, x, norm)
    te, ee = tm.nn.Embedding(100, 32, key=key), eqx.nn.Embedding(100, 32, key=key)
    idx = jnp.asarray(7)
    out["Embedding 100x32, one index"] = (te, ee, idx, lambda: ee.weight[idx])
    return out


def bench_eager(quick: bool) -> dict[str, Any]:
    import treemod as tm

    results: dict[str, Any] = {}
    for name, (tm_layer, eqx_layer, x, plain) in _layers().items():

        def unchecked(layer: Any = tm_layer, x: Any = x) -> Any:
            with tm.shape_checks(False):
                return layer(x)

        cases = {
            "treemod (checks on)": lambda layer=tm_layer, x=x: layer(x),
            "treemod (checks off)": unchecked,
            "equinox": lambda layer=eqx_layer, x=x: layer(x),
            "plain jax.numpy": plain,
        }
        per_call = _alternate(cases, rounds=5 if quick else 15, block=50 if quick else 200)
        results[name] = {
            "per_call": per_call,
            "ratios": _ratios(
                per_call,
                {
                    "checks on / equinox": ("treemod (checks on)", "equinox"),
                    "checks off / equinox": ("treemod (checks off)", "equinox"),
                    "equinox / plain": ("equinox", "plain jax.numpy"),
                },
            ),
        }
    return results


# ------------------------------------------------------------------------------ import time

_IMPORT_CHILD = """
import time, sys
t0, c0 = time.perf_counter(), time.process_time()
import jax
t1, c1 = time.perf_counter(), time.process_time()
__import__(sys.argv[1])
t2, c2 = time.perf_counter(), time.process_time()
print((t1 - t0) * 1e3, (t2 - t1) * 1e3, (c1 - c0) * 1e3, (c2 - c1) * 1e3)
"""


def bench_import(quick: bool) -> dict[str, Any]:
    # Bytecode as an installed package has it: with PYTHONDONTWRITEBYTECODE set (as on the
    # shared machine), a source file changed since its .pyc was written is compiled again in
    # every process, which once made up most of `import treemod`'s time there.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import jax, treemod, equinox"], check=True, env=env)
    runs: dict[str, list[list[float]]] = {"treemod": [], "equinox": []}
    for _ in range(3 if quick else 15):
        for name in runs:  # alternate
            out = subprocess.run(
                [sys.executable, "-c", _IMPORT_CHILD, name],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
                env=env,
            )
            runs[name].append(list(map(float, out.stdout.split())))
    every = [row for rows in runs.values() for row in rows]
    return {
        "import jax (ms)": _ms([row[0] for row in every]),
        "import jax, CPU time (ms)": _ms([row[2] for row in every]),
        **{f"import {k} after jax (ms)": _ms([row[1] for row in v]) for k, v in runs.items()},
        **{
            f"import {k} after jax, CPU time (ms)": _ms([row[3] for row in v])
            for k, v in runs.items()
        },
        "target": "treemod within 50 ms of import jax (median of fresh processes)",
    }


def _ms(values: list[float]) -> dict[str, float]:
    return timing.summary(values)


# ------------------------------------------------------------------------------ ahead of time


def _jit_of(step: Callable[..., Any]) -> Any:
    """The `filter_jit` training step inside a workload's `Case.step` closure."""
    from treemod import JitWrapped

    for cell in step.__closure__ or ():
        if isinstance(cell.cell_contents, JitWrapped):
            return cell.cell_contents
    raise LookupError("no filter_jit step in the closure")


def aot_child(mode: str, name: str, path: str, quick: bool) -> dict[str, Any]:
    """In a new process: build the workload, then time its first step `mode`'s way."""
    t0 = time.perf_counter()
    import jax

    import treemod as tm
    from benchmarks.worker import _batch
    from benchmarks.workloads import treemod_models
    from benchmarks.workloads.spec import workloads

    res: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    w = workloads(quick)[name]
    case = treemod_models.build(w)
    t = time.perf_counter()
    carry = case.make_carry(case.make_model(0))
    x, y = _batch(w, w.tiny_batch, case.channels_last)
    case.wait(carry)
    res["build_s"] = time.perf_counter() - t
    train_step = _jit_of(case.step)
    t = time.perf_counter()
    if mode == "cold":
        jax.block_until_ready(train_step(*carry, x, y))
        res["first_step_s"] = time.perf_counter() - t
        res["steady_step_s"] = _steady(train_step, carry, x, y)
    elif mode == "save":  # compiled by save_compiled, with the options that load fast
        tm.save_compiled(path, train_step.lower(*carry, x, y))
        res["save_s"] = time.perf_counter() - t
        res["file_mb"] = os.path.getsize(path) / 1e6
    else:
        from jax.experimental import serialize_executable

        original = serialize_executable.deserialize_and_load
        phases: dict[str, float] = {}

        def timed(*args: Any, **kwargs: Any) -> Any:
            s = time.perf_counter()
            out = original(*args, **kwargs)
            phases["deserialise_s"] = time.perf_counter() - s
            return out

        serialize_executable.deserialize_and_load = timed  # type: ignore[assignment]
        step = tm.load_compiled(path)
        res["load_s"] = time.perf_counter() - t
        res["read_unpickle_s"] = res["load_s"] - phases["deserialise_s"]
        res["deserialise_s"] = phases["deserialise_s"]
        s = time.perf_counter()
        jax.block_until_ready(step(*carry, x, y))
        res["first_run_s"] = time.perf_counter() - s
        res["first_step_s"] = time.perf_counter() - t
        res["steady_step_s"] = _steady(step, carry, x, y)
    res["process_s"] = time.perf_counter() - t0
    return res


def _steady(step: Callable[..., Any], carry: Any, x: Any, y: Any) -> float:
    """The median of three later steps (the saved program may differ from the cold one's)."""
    import jax

    times = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(step(*carry, x, y))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _child(mode: str, name: str, path: str, quick: bool) -> dict[str, Any]:
    args = [sys.executable, "-m", "benchmarks.everyday", "--aot-child", mode, name, path]
    t = time.perf_counter()
    out = subprocess.run(
        args + (["--quick"] if quick else []), capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(f"{mode} {name} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall  # the whole process, interpreter start included
    return res


def bench_aot(quick: bool, names: list[str], repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(tmp, f"{name}.jaxexe")
            save = _child("save", name, path, quick)
            cold: list[dict[str, Any]] = []
            aot: list[dict[str, Any]] = []
            for _ in range(repeats):  # alternate
                cold.append(_child("cold", name, path, quick))
                aot.append(_child("aot", name, path, quick))

            def med(runs: list[dict[str, Any]], key: str) -> float:
                return statistics.median(r[key] for r in runs)

            keys_aot = ("load_s", "read_unpickle_s", "deserialise_s", "first_run_s")
            results[name] = {
                "save": save,
                "cold": {
                    k: med(cold, k) for k in ("first_step_s", "steady_step_s", "wall_s", "import_s")
                },
                "cold_first_step_range_s": [
                    min(r["first_step_s"] for r in cold),
                    max(r["first_step_s"] for r in cold),
                ],  # fmt: skip
                "aot": {
                    k: med(aot, k) for k in ("first_step_s", "steady_step_s", "wall_s") + keys_aot
                },
                "aot_first_step_range_s": [
                    min(r["first_step_s"] for r in aot),
                    max(r["first_step_s"] for r in aot),
                ],  # fmt: skip
                "first step aot / cold": med(aot, "first_step_s") / med(cold, "first_step_s"),
                "whole process aot / cold": med(aot, "wall_s") / med(cold, "wall_s"),
                "steady step aot / cold": med(aot, "steady_step_s") / med(cold, "steady_step_s"),
                "repeats": repeats,
            }
    return results


# ------------------------------------------------------------------------------ main


def _machine() -> dict[str, Any]:
    import platform

    import jax

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, tiny workloads")
    parser.add_argument("--only", default="rewrap,eager,import,aot", help="which measurements")
    parser.add_argument(
        "--workloads",
        default="mlp8,resnet18,transformer12,stack48_unrolled",
        help="workloads for the ahead-of-time measurement",
    )
    parser.add_argument("--repeats", type=int, default=3, help="new processes per AOT contender")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/everyday.json"))
    parser.add_argument("--aot-child", nargs=3, metavar=("MODE", "WORKLOAD", "PATH"))
    args = parser.parse_args()
    if args.aot_child:
        print(json.dumps(aot_child(*args.aot_child, quick=args.quick)))
        return
    only = set(args.only.split(","))
    out: dict[str, Any] = {"machine": _machine()}
    path = Path(args.json)
    if path.exists():  # keep the parts not measured this time
        out = {**json.loads(path.read_text()), **out}
    if "rewrap" in only:
        out["rewrap"] = bench_rewrap(args.quick)
    if "eager" in only:
        out["eager"] = bench_eager(args.quick)
    if "import" in only:
        out["import"] = bench_import(args.quick)
    if "aot" in only:
        out["aot"] = bench_aot(args.quick, args.workloads.split(","), args.repeats)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
