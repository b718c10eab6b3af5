"""The speed targets a suite run is checked against: treemod's first call and steady step
against plain JAX's and the fastest peer's, and the deep stack against the shallow one, each
as a ratio of medians from one run, with the ratio per repeat where the run was paired."""

from __future__ import annotations

from typing import Any

from .summary import stats
from .workloads.spec import FRAMEWORKS, LABELS

FIRST_CALL_LIMIT = 1.05
STEP_LIMIT = 1.10
STACK_LIMIT = 1.5
STACK_METRICS = (
    ("jit_total_s", "trace+lower+compile"),
    ("first_call_cpu_s", "first call CPU (incl. running 12x the layers)"),
)


def framework_order(data: dict[str, Any]) -> list[str]:
    return [
        f
        for f in FRAMEWORKS
        if data["frameworks"].get(f, {}).get("status") not in (None, "skipped")
    ]


def metric_stats(data: dict[str, Any], wl: str, fw: str, m: str) -> dict[str, float] | None:
    metrics: dict[str, dict[str, float]] = (
        data["summary"].get(wl, {}).get(fw, {}).get("metrics", {})
    )
    return metrics.get(m)


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets for treemod, each with the measured value and whether it is met.

    First-call and step ratios are given for wall time and for the process's CPU time (steadier
    on a busy machine); the Stack target compares trace + lowering + compile time. A target is
    judged on the ratio of medians; each also carries the ratios repeat by repeat (`_per_repeat`),
    which show how often it held.
    """
    out: list[dict[str, Any]] = []
    peers = [f for f in framework_order(data) if f not in ("jax", "treemod")]
    for wl in data["workloads"]:
        mine = (wl, "treemod")
        for metric, what in (
            ("first_call_s", "first call"),
            ("first_call_cpu_s", "first call CPU"),
        ):
            name = f"{wl}: {what} / plain JAX"
            out += _compare(data, name, metric, mine, (wl, "jax"), FIRST_CALL_LIMIT)
            others = [(p, s) for p in peers if (s := metric_stats(data, wl, p, metric))]
            if others:
                best = min(others, key=lambda ps: ps[1]["median"])[0]
                name = f"{wl}: {what} / fastest peer ({LABELS[best]})"
                out += _compare(data, name, metric, mine, (wl, best), 1.0)
        for metric, what in (
            ("step_tiny_s", "tiny-batch step"),
            ("step_tiny_cpu_s", "tiny step CPU"),
        ):
            name = f"{wl}: {what} / plain JAX"
            out += _compare(data, name, metric, mine, (wl, "jax"), STEP_LIMIT)
    for metric, what in STACK_METRICS:
        if not from_one_run(data, metric):
            continue  # 4 and 48 blocks measured in different runs: their ratio would mislead
        name = f"Stack: {what}, 48 blocks / 4"
        cells = ("stack48_scan", "treemod"), ("stack4_scan", "treemod")
        out += _compare(data, name, metric, *cells, STACK_LIMIT)
    return out


def from_one_run(data: dict[str, Any], metric: str) -> bool:
    """Whether treemod's 4- and 48-block `metric` come from the same run (of a merged report)."""
    runs = {
        data["summary"].get(wl, {}).get("treemod", {}).get("source", {}).get(metric)
        for wl in ("stack4_scan", "stack48_scan")
    }
    return len(runs - {None}) <= 1


def _per_repeat(
    data: dict[str, Any], metric: str, cell: tuple[str, str], other: tuple[str, str]
) -> list[float]:
    """`metric` of `cell` over that of `other` (each a (workload, framework)), repeat by repeat.

    The k-th process of each cell, in the run its figure comes from, belongs to repeat k; a
    repeat alternates the libraries, so the two ran minutes apart at most and a slow phase of
    the machine weighs on both. Repeats in which either process failed are left out.
    """

    def by_repeat(wl: str, fw: str) -> list[float | None]:
        run = data["summary"][wl][fw].get("source", {}).get(metric)
        mine = [
            r for r in data["records"]
            if r["workload"] == wl and r["framework"] == fw and r.get("run") == run
        ]  # fmt: skip
        return [r.get(metric) for r in sorted(mine, key=lambda r: r.get("process", 0))]

    pairs = zip(by_repeat(*cell), by_repeat(*other), strict=False)
    return [a / b for a, b in pairs if a is not None and b]


def _compare(
    data: dict[str, Any],
    name: str,
    metric: str,
    cell: tuple[str, str],
    other: tuple[str, str],
    limit: float,
) -> list[dict[str, Any]]:
    """The target that `metric` of `cell` is at most `limit` times that of `other` (each a
    (workload, framework)), judged on the ratio of medians; none when either was not measured."""
    mine, theirs = metric_stats(data, *cell, metric), metric_stats(data, *other, metric)
    if not (mine and theirs):
        return []
    value = mine["median"] / theirs["median"]
    target = {"name": name, "value": value, "limit": limit, "ok": value <= limit}
    per_repeat = _per_repeat(data, metric, cell, other)
    if per_repeat:
        target["per_repeat"] = stats(per_repeat) | {"within": sum(r <= limit for r in per_repeat)}
    return [target]


# --- Markdown --------------------------------------------------------------------------------
