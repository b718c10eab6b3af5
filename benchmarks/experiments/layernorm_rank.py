"""Why plain JAX compiles the unrolled Transformers slowly on a CPU: the rank of its LayerNorm.

    python -m benchmarks.experiments.layernorm_rank \
        [--depths 2,4,8,12] [--rounds 3] [--skip-steps]

Three versions of the Transformer workload's training step, built in one process:

- `jax`: the suite's plain-JAX step (`benchmarks/workloads/jax_dicts.py`), whose LayerNorm
  normalises the last axis of the `(batch, sequence, width)` activations;
- `jax_rows`: the same code with one change, LayerNorm reshapes its input to `(rows, width)`
  and back, as treemod's layers do (`batch_apply` flattens the batch dimensions);
- `treemod`: the suite's treemod step.

For each depth it keeps the StableHLO module of each version's first step, compiles the
modules again in shuffled rounds (`benchmarks.same_program.compile_times`), and reads the
optimised HLO of one compile: its line count and its largest fusions, in instructions. At the
workload's own depth (12) it then times the steady step at the tiny and the realistic batch,
the versions taking turns sample by sample. `--peers` also prints the largest fusions of the
other libraries' steps at the first two depths.
"""

import argparse
import contextlib
import dataclasses
import importlib
import re
import time
from collections.abc import Iterator
from typing import Any

import jax

from benchmarks import timing
from benchmarks.run import unavailable
from benchmarks.same_program import _compiles_seen, compile_times
from benchmarks.worker import _batch
from benchmarks.workloads import MODULES, jax_dicts
from benchmarks.workloads.spec import Workload, workloads

VERSIONS = ("jax", "jax_rows", "treemod")


def _ln_rows(p: Any, x: jax.Array) -> jax.Array:
    shape = x.shape
    return _ln_natural(p, x.reshape(-1, shape[-1])).reshape(shape)


_ln_natural = jax_dicts._ln


@contextlib.contextmanager
def _version(name: str) -> Iterator[Any]:
    """The workload module of `name` (a version or a library), with the plain-JAX LayerNorm
    swapped for `jax_rows`."""
    if name == "jax_rows":
        jax_dicts._ln = _ln_rows  # looked up when the step is traced
    try:
        yield jax_dicts if name == "jax_rows" else importlib.import_module(MODULES[name])
    finally:
        jax_dicts._ln = _ln_natural


def _first_step(name: str, w: Workload, batch: int) -> tuple[Any, Any, str]:
    """Build `name`'s case, run its first step; return the case, the carry and its module."""
    with _version(name) as module:
        case = module.build(w)
        carry = case.make_carry(case.make_model(0))
        x, y = _batch(w, batch, case.channels_last)
        with _compiles_seen() as seen:
            carry, loss = case.step(carry, x, y)
            jax.block_until_ready(loss)
    text = max((a[1].operation.get_asm(enable_debug_info=False) for a in seen), key=len)
    return case, carry, text


def _optimised(text: str) -> tuple[int, list[int]]:
    """Line count of the optimised HLO of `text`, and its four largest fusions (instructions)."""
    from jax._src import compiler
    from jax._src.lib.mlir import ir

    with _compiles_seen() as seen:
        jax.jit(lambda a: a + 1.0)(jax.numpy.ones(2)).block_until_ready()
    backend, probe, *args = seen[0]
    with probe.context:
        module = ir.Module.parse(text)
    hlo = compiler.backend_compile_and_load(backend, module, *args).hlo_modules()[0].to_string()
    fusions = [c.count("\n") for c in re.split(r"\n(?=\S)", hlo) if c.startswith("%fused")]
    return hlo.count("\n"), sorted(fusions, reverse=True)[:4]


def compile_table(w: Workload, depths: list[int], rounds: int) -> None:
    print(f"{'depth':>5} {'version':<9} {'compile s, median [min-max]':<28} {'HLO lines':>9}  "
          "largest fusions")  # fmt: skip
    for depth in depths:
        wd = dataclasses.replace(w, depth=depth)
        texts = {name: _first_step(name, wd, wd.tiny_batch)[2] for name in VERSIONS}
        times = compile_times(texts, rounds)
        for name in VERSIONS:
            lines, largest = _optimised(texts[name])
            t = times[name]
            cell = timing.spread(t, digits=2)
            print(f"{depth:>5} {name:<9} {cell:<28} {lines:>9}  {largest}", flush=True)


def peers_table(w: Workload, depths: list[int]) -> None:
    for name in ("equinox", "nnx", "linen", "haiku"):
        if unavailable(name):
            print(f"skipping {name}: {unavailable(name)}")
            continue
        for depth in depths:
            wd = dataclasses.replace(w, depth=depth)
            lines, largest = _optimised(_first_step(name, wd, wd.tiny_batch)[2])
            print(f"{depth:>5} {name:<9} {'':<28} {lines:>9}  {largest}", flush=True)


def step_table(w: Workload, samples: int) -> None:
    for label, batch, iters in (("tiny", w.tiny_batch, 5), ("realistic", w.big_batch, 2)):
        runs = {}
        for name in VERSIONS:
            case, carry, _ = _first_step(name, w, batch)
            runs[name] = [case, carry, *_batch(w, batch, case.channels_last)]
        times: dict[str, list[float]] = {name: [] for name in VERSIONS}
        for _ in range(samples + 1):  # the first sample warms up
            for name in VERSIONS:
                case, carry, x, y = runs[name]
                t = time.perf_counter()
                for _ in range(iters):
                    carry, loss = case.step(carry, x, y)
                jax.block_until_ready(loss)
                times[name].append((time.perf_counter() - t) / iters)
                runs[name][1] = carry
        print(f"steady step, {label} batch ({batch}), ms per step over {samples} samples of "
              f"{iters}:")  # fmt: skip
        for name in VERSIONS:
            t = [1e3 * s for s in times[name][1:]]
            print(f"  {name:<9} {timing.spread(t):>7}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", default="2,4,8,12")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--peers", action="store_true")
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    w = workloads(False)["transformer12"]
    depths = [int(d) for d in args.depths.split(",")]
    compile_table(w, depths, args.rounds)
    if args.peers:
        peers_table(w, depths[:2])
    if not args.skip_steps:
        step_table(w, args.samples)


if __name__ == "__main__":
    main()
