"""benchmarks/timing.py: the orders, the statistics and the timing of a block of calls, against
hand-computed values (Python's `statistics`) and a fake clock."""

from __future__ import annotations

import random
import statistics

import pytest

from benchmarks import timing


def test_round_orders() -> None:
    names = ["a", "b", "c"]
    assert [timing.round_order(names, r, "alternate") for r in range(2)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
    ]
    assert [timing.round_order(names, r, "rotate") for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    shuffled = [timing.round_order(names, r, "shuffle", random.Random(3)) for r in range(5)]
    assert all(sorted(o) == names for o in shuffled)
    assert timing.round_order(names, 7, "fixed") == names
    assert names == ["a", "b", "c"]  # the caller's list is never reordered


def test_summary_spread_and_paired_ratio_match_statistics() -> None:
    xs = [0.004, 0.001, 0.003, 0.002]
    assert timing.summary(xs) == {"median": statistics.median(xs), "min": 0.001, "max": 0.004}
    assert timing.summary(xs, scale=1e6, unit="us") == pytest.approx(
        {"median_us": 2500.0, "min_us": 1000.0, "max_us": 4000.0}
    )
    assert timing.spread(xs, scale=1e3, digits=2) == "2.50 [1.00-4.00]"
    # Paired by round: the reference's drift cancels.
    assert timing.paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 4.0]) == 2.0
    with pytest.raises(ValueError):
        timing.paired_ratio([1.0], [1.0, 2.0])


def test_time_block_and_alternate_with_a_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing.time, "process_time", lambda: now[0] / 2)
    log: list[str] = []

    def make(name: str, cost: float):
        def call() -> str:
            now[0] += cost
            log.append(name)
            return name

        return call

    readied: list[str] = []
    wall, cpu = timing.time_block(make("x", 0.5), 4, ready=readied.append, cpu=True)
    assert (wall, cpu, readied) == (0.5, 0.25, ["x"])  # one wait, for the last result

    log.clear()
    samples = timing.alternate(
        {"a": make("a", 1.0), "b": make("b", 3.0)}, rounds=2, block=2, ready=lambda out: out
    )
    assert samples == {"a": [1.0, 1.0], "b": [3.0, 3.0]}
    # One warm-up call each, then the rounds in alternating order.
    assert log == ["a", "b", "a", "a", "b", "b", "b", "b", "a", "a"]
