"""What a `jax.random.split` costs XLA to compile on its own (one process, shuffled rounds).

    python -m benchmarks.experiments.key_split

Compiles two tiny programs side by side with `benchmarks.same_program.compile_times`: one
that splits a key and doubles a vector, one that only doubles the vector. The difference is
the compile cost of the Threefry hash that every training step splitting a key pays.
"""

import jax

from benchmarks import timing
from benchmarks.same_program import compile_times


def main() -> None:
    key, x = jax.random.PRNGKey(0), jax.numpy.ones(3)
    texts = {
        "split": jax.jit(lambda k, v: (jax.random.split(k), v * 2)).lower(key, x).as_text(),
        "no split": jax.jit(lambda k, v: (k, v * 2)).lower(key, x).as_text(),
    }
    for name, times in compile_times(texts, rounds=15).items():
        print(f"{name:<9} median {timing.spread(times, scale=1e3)} ms")


if __name__ == "__main__":
    main()
