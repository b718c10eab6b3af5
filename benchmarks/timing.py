"""Timing helpers shared by every benchmark script: alternate the contenders, repeat, report
medians and ranges.

One process runs every contender, round after round, in an order that changes per round
(`round_order`), so a drift in machine load touches all of them alike; within a round each
contender is timed over a block of calls ending when its result is ready (`time_block`). A
figure is the median over rounds, with the range beside it (`summary`, `spread`); a comparison
is the median of per-round ratios (`paired_ratio`), which cancels most of the drift.

Example:
    >>> from benchmarks import timing
    >>> calls = {"a": lambda: 1, "b": lambda: 2}
    >>> samples = timing.alternate(calls, rounds=3, block=2, ready=lambda out: out)
    >>> sorted(samples), len(samples["a"])
    (['a', 'b'], 3)
    >>> timing.summary([1.0, 3.0, 2.0])
    {'median': 2.0, 'min': 1.0, 'max': 3.0}
    >>> timing.spread([0.001, 0.003, 0.002], scale=1e3)
    '2.0 [1.0-3.0]'
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

__all__ = [
    "alternate",
    "paired_ratio",
    "round_order",
    "spread",
    "summary",
    "time_block",
]

Order = Literal["alternate", "rotate", "shuffle", "fixed"]
T = TypeVar("T")


def _block_until_ready(out: Any) -> Any:
    import jax

    return jax.block_until_ready(out)


def round_order(
    names: Sequence[T],
    round_index: int,
    how: Order = "alternate",
    rng: random.Random | None = None,
) -> list[T]:
    """The contenders' order in one round.

    Arguments:
        names: the contenders.
        round_index: which round (0, 1, ...).
        how: `"alternate"` (forward on even rounds, backward on odd ones), `"rotate"` (start one
            later each round), `"shuffle"` (a random order from `rng`) or `"fixed"`.
        rng: the generator for `"shuffle"` (seeded by the caller, for reruns).

    Returns:
        The names in this round's order.
    """
    names = list(names)
    if how == "alternate":
        return names if round_index % 2 == 0 else names[::-1]
    if how == "rotate":
        k = round_index % len(names)
        return names[k:] + names[:k]
    if how == "shuffle":
        (rng or random.Random(round_index)).shuffle(names)
        return names
    return names


def time_block(
    run: Callable[[], Any],
    calls: int = 1,
    *,
    ready: Callable[[Any], Any] = _block_until_ready,
    cpu: bool = False,
) -> Any:
    """Seconds per call of `run`, over `calls` calls ending when the last result is ready.

    Arguments:
        run: the call to time (no arguments; close over them).
        calls: how many calls the block makes.
        ready: waits for a result (default `jax.block_until_ready`).
        cpu: also measure the process's CPU time.

    Returns:
        Wall seconds per call, or `(wall, cpu)` seconds per call if `cpu`.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    out = None
    for _ in range(calls):
        out = run()
    ready(out)
    wall = (time.perf_counter() - start) / calls
    if cpu:
        return wall, (time.process_time() - cpu_start) / calls
    return wall


def alternate(
    cases: dict[str, Callable[[], Any]],
    rounds: int,
    *,
    block: int = 1,
    order: Order = "alternate",
    seed: int = 0,
    warmup: int = 1,
    ready: Callable[[Any], Any] = _block_until_ready,
) -> dict[str, list[float]]:
    """Seconds per call of each case, one sample per round, the cases alternating.

    Arguments:
        cases: name -> a call to time (each is compiled and warmed up first).
        rounds: samples per case.
        block: calls per sample (their mean is the sample).
        order: how the cases take turns (`round_order`).
        seed: for `order="shuffle"`.
        warmup: untimed calls of each case first.
        ready: waits for a result (default `jax.block_until_ready`).

    Returns:
        name -> the per-round samples, in seconds per call.
    """
    for fn in cases.values():
        for _ in range(warmup):
            ready(fn())
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        for name in round_order(list(cases), r, order, rng):
            samples[name].append(time_block(cases[name], block, ready=ready))
    return samples


def summary(samples: Sequence[float], *, scale: float = 1.0, unit: str = "") -> dict[str, float]:
    """The median, minimum and maximum of `samples` times `scale`.

    Arguments:
        samples: the measurements.
        scale: a factor (1e3 for milliseconds from seconds, 1e6 for microseconds).
        unit: appended to the keys (`"us"` gives `median_us`, `min_us`, `max_us`).

    Returns:
        `{"median": ..., "min": ..., "max": ...}`, keys suffixed with `_unit` if given.
    """
    suffix = f"_{unit}" if unit else ""
    return {
        f"median{suffix}": statistics.median(samples) * scale,
        f"min{suffix}": min(samples) * scale,
        f"max{suffix}": max(samples) * scale,
    }


def spread(samples: Sequence[float], *, scale: float = 1.0, digits: int = 1) -> str:
    """`"median [min-max]"` of `samples` times `scale`, with `digits` decimals."""
    s = summary(samples, scale=scale)
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def paired_ratio(samples: Sequence[float], reference: Sequence[float]) -> float:
    """The median over rounds of `samples[r] / reference[r]` (both timed in round `r`)."""
    return statistics.median(a / b for a, b in zip(samples, reference, strict=True))
