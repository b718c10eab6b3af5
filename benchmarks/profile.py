"""Profile the first call of one framework's training step (where its trace time goes).

    python -m benchmarks.profile --framework treemod --workload transformer12 [--quick]

Builds the model, then runs the first call of the training step under `cProfile` and prints the
functions with the most own time, and the total spent in the framework's own files, in JAX's
tracing, and in XLA compilation. Use it when a first-call ratio misses its target.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import sys

from .workloads import MODULES
from .workloads.spec import workloads

PACKAGES = {
    "jax": "benchmarks/workloads",
    "treemod": "treemod/",
    "equinox": "equinox/",
    "nnx": "flax/",
    "nnx_tree": "flax/",
    "linen": "flax/",
    "haiku": "haiku/",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--framework", required=True, choices=sorted(MODULES))
    parser.add_argument("--workload", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)

    import jax

    from .worker import _batch

    w = workloads(args.quick)[args.workload]
    case = importlib.import_module(MODULES[args.framework]).build(w)
    carry = case.make_carry(case.make_model(0))
    x, y = _batch(w, w.tiny_batch, case.channels_last)
    prof = cProfile.Profile()
    prof.enable()
    carry, loss = case.step(carry, x, y)
    jax.block_until_ready(loss)
    prof.disable()

    stats = pstats.Stats(prof, stream=sys.stdout)
    own = sum(
        v[2]
        for k, v in stats.stats.items()
        if PACKAGES[args.framework] in k[0]  # type: ignore[attr-defined]
    )
    jax_py = sum(v[2] for k, v in stats.stats.items() if "/jax/" in k[0])  # type: ignore[attr-defined]
    total = max(v[3] for v in stats.stats.values())  # type: ignore[attr-defined]
    print(f"first call: {total:.3f} s; own time in {PACKAGES[args.framework]}: {own:.3f} s; "
          f"in jax's Python: {jax_py:.3f} s (the rest is mostly XLA compilation)")  # fmt: skip
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
