"""Measure one framework on one or more workloads in this (fresh) process; write JSON.

Run by `benchmarks.run`, one process per (framework, workload, repeat):

    python -m benchmarks.worker --framework jax --workloads mlp8 --out result.json

The process first times its imports (JAX, optax, then the framework), then for each workload:
eager model construction, construction under `eval_shape` and inside `jit`, the first call of
the training step (split into JAX's trace, lowering and XLA compile time, which JAX reports
through `jax.monitoring`), and steady-state step times at a tiny and a realistic batch size.
The DARTS workload's case comes from `darts_<framework>.make_step` (`case.bilevel_case`): its
construction is of the whole carry, eager only, and it has one batch (a training and a
validation half).
"""

from __future__ import annotations

import time

_T_START = time.perf_counter()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

from . import timing  # noqa: E402
from .workloads import MODULES  # noqa: E402
from .workloads.case import bilevel_case  # noqa: E402
from .workloads.spec import REQUIRES, Workload, darts_config, expected_params, suite  # noqa: E402

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"

DEFAULTS: dict[str, Any] = {
    "tiny_iters": 20,  # steps per timing sample at the tiny batch (MLPs)
    "tiny_iters_heavy": 5,  # ... for the CNN and the Transformers (compute-bound even so)
    "tiny_samples": 5,
    "big_iters": 3,  # steps per timing sample at the realistic batch
    "big_samples": 3,
    "init_jit": True,  # also time construction inside jit
    "init_jit_workloads": None,  # ... on these workloads only (None: all)
    "big": True,  # also measure the realistic batch
    "big_workloads": None,  # ... on these workloads only (None: all that have one)
    "darts_size": None,  # the DARTS supernet's size, "small" or "tiny" (None: tiny if quick)
}


class CompileEvents:
    """Sums JAX's trace / lowering / compile durations reported since the last `reset`."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.compiles = 0

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in (TRACE, LOWER, COMPILE):
            self.totals[event] = self.totals.get(event, 0.0) + duration
            self.compiles += event == COMPILE

    def reset(self) -> None:
        self.totals = {}
        self.compiles = 0

    def summary(self) -> dict[str, float]:
        return {
            "trace_s": self.totals.get(TRACE, 0.0),
            "lower_s": self.totals.get(LOWER, 0.0),
            "compile_s": self.totals.get(COMPILE, 0.0),
            "n_compiles": self.compiles,
        }


def _time_imports(framework: str) -> dict[str, float]:
    """Import JAX, optax and the framework, timing each (this process imported none yet)."""
    out: dict[str, float] = {}
    for name in REQUIRES[framework]:
        label = {"jax": "import_jax_s", "optax": "import_optax_s"}.get(name, "import_framework_s")
        t = time.perf_counter()
        importlib.import_module(name)
        out[label] = out.get(label, 0.0) + time.perf_counter() - t
    out.setdefault("import_framework_s", 0.0)
    out["import_s"] = sum(out.values())
    return out


def _batch(w: Workload, n: int, channels_last: bool) -> tuple[Any, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(n)
    y = jnp.asarray(rng.integers(0, w.classes, size=(n,)), dtype=jnp.int32)
    if w.kind == "darts":  # a bilevel step's (training, validation) images and labels
        xs = rng.standard_normal((2, n, w.image, w.image, 3))
        ys = rng.integers(0, w.classes, size=(2, n))
        x = tuple(jnp.asarray(v, dtype=jnp.float32) for v in xs)
        return x, tuple(jnp.asarray(v, dtype=jnp.int32) for v in ys)
    if w.kind == "mlp":
        x = jnp.asarray(rng.standard_normal((n, w.width)), dtype=jnp.float32)
    elif w.kind == "resnet":
        shape = (n, w.image, w.image, 3) if channels_last else (n, 3, w.image, w.image)
        x = jnp.asarray(rng.standard_normal(shape), dtype=jnp.float32)
    else:
        x = jnp.asarray(rng.integers(0, w.vocab, size=(n, w.seq)), dtype=jnp.int32)
    return x, y


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def _steady(
    case: Any, carry: Any, x: Any, y: Any, iters: int, samples: int
) -> tuple[Any, Any, float, float]:
    """The carry and loss after the last step, and the median seconds per step (wall and
    process CPU) over `samples` runs of `iters` steps.

    The steps of a sample are dispatched asynchronously, as in a training loop; the sample ends
    when the last loss is ready.
    """
    import jax

    step = case.step
    for _ in range(2):  # warm up
        carry, loss = step(carry, x, y)
    jax.block_until_ready(loss)
    state = [carry, loss]

    def one_step() -> Any:
        state[0], state[1] = step(state[0], x, y)
        return state[1]

    walls_cpus = [timing.time_block(one_step, iters, cpu=True) for _ in range(samples)]
    case.wait(state[0])
    wall = timing.summary([w for w, _ in walls_cpus])["median"]
    return state[0], state[1], wall, timing.summary([c for _, c in walls_cpus])["median"]


def measure(framework: str, w: Workload, events: CompileEvents, cfg: dict[str, Any]) -> dict:
    """All measurements of one workload (imports already done)."""
    import jax

    res: dict[str, Any] = {}
    if w.kind == "darts":
        case = bilevel_case(framework, darts_config(w))
    else:
        case = importlib.import_module(MODULES[framework]).build(w)

    t, c = time.perf_counter(), time.process_time()
    model = case.make_model(0)
    case.wait(model)
    res["init_s"] = time.perf_counter() - t
    res["init_cpu_s"] = time.process_time() - c
    res["params"] = case.count_params(model)
    if res["params"] != expected_params(w):
        raise AssertionError(
            f"{framework}/{w.name}: {res['params']} parameters, expected {expected_params(w)}"
        )
    if case.make_model_abstract is not None:
        _, res["init_abstract_s"] = _timed(case.make_model_abstract, 1)
    if (
        case.make_model_jit is not None
        and cfg["init_jit"]
        and (cfg["init_jit_workloads"] is None or w.name in cfg["init_jit_workloads"])
    ):
        t = time.perf_counter()
        case.wait(case.make_model_jit(2))
        res["init_jit_s"] = time.perf_counter() - t
    if case.make_carry is None:  # the model is the whole carry
        carry = model
    else:
        carry, res["opt_init_s"] = _timed(case.make_carry, model)
        case.wait(carry)
    del model

    x, y = _batch(w, w.tiny_batch, case.channels_last)
    events.reset()
    t, c = time.perf_counter(), time.process_time()
    carry, loss = case.step(carry, x, y)
    jax.block_until_ready(loss)
    case.wait(carry)
    res["first_call_s"] = time.perf_counter() - t
    res["first_call_cpu_s"] = time.process_time() - c
    res["first_loss"] = float(loss)
    res.update(events.summary())
    res["jit_total_s"] = res["trace_s"] + res["lower_s"] + res["compile_s"]
    iters = cfg["tiny_iters"] if w.kind == "mlp" else cfg["tiny_iters_heavy"]
    carry, loss, res["step_tiny_s"], res["step_tiny_cpu_s"] = _steady(
        case, carry, x, y, iters, cfg["tiny_samples"]
    )

    if (
        cfg["big"]
        and w.big_batch
        and (cfg["big_workloads"] is None or w.name in cfg["big_workloads"])
    ):
        x, y = _batch(w, w.big_batch, case.channels_last)
        t = time.perf_counter()
        carry, loss = case.step(carry, x, y)
        jax.block_until_ready(loss)
        res["first_call_big_s"] = time.perf_counter() - t
        carry, loss, res["step_big_s"], res["step_big_cpu_s"] = _steady(
            case, carry, x, y, cfg["big_iters"], cfg["big_samples"]
        )
    res["loss"] = float(loss)  # after the last step
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", required=True)
    parser.add_argument("--workloads", required=True, help="comma-separated names")
    parser.add_argument("--quick", action="store_true", help="use the tiny sizes")
    parser.add_argument("--config", default="{}", help="JSON overrides of the step counts")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cfg = {**DEFAULTS, **json.loads(args.config)}

    records: list[dict[str, Any]] = []
    base = {"framework": args.framework}
    try:
        imports = _time_imports(args.framework)
    except Exception as e:  # the framework cannot even be imported
        err = f"{type(e).__name__}: {e}"
        for name in args.workloads.split(","):
            records.append({**base, "workload": name, "error": err})
        _write(args.out, records)
        return 0

    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # no persistent cache
    events = CompileEvents()
    jax.monitoring.register_event_duration_secs_listener(events)

    specs = suite(args.quick, cfg["darts_size"])
    for i, name in enumerate(args.workloads.split(",")):
        rec: dict[str, Any] = {**base, "workload": name, **imports, "imports_shared": i > 0}
        try:
            rec.update(measure(args.framework, specs[name], events, cfg))
        except Exception as e:
            tb = traceback.format_exc(limit=-3)
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = tb
            print(tb, file=sys.stderr)
        records.append(rec)
        jax.clear_caches()
    _write(args.out, records)
    return 0


def _write(path: str, records: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
