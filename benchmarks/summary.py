"""What a suite run's records come to: per workload and library, the median, minimum and
maximum of each metric, and each median's ratio to plain JAX's (the suite's floor)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["METRICS", "stats", "summarise"]

METRICS = (
    "import_s",
    "import_framework_s",
    "init_s",
    "init_cpu_s",
    "init_abstract_s",
    "init_jit_s",
    "opt_init_s",
    "first_call_s",
    "first_call_cpu_s",
    "trace_s",
    "lower_s",
    "compile_s",
    "jit_total_s",
    "n_compiles",
    "step_tiny_s",
    "step_tiny_cpu_s",
    "first_call_big_s",
    "step_big_s",
    "step_big_cpu_s",
    "params",
)


def stats(values: list[float]) -> dict[str, float]:
    """Median, min, max and count of `values`."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Median, min, max of each metric per (workload, framework), and ratios to plain JAX."""
    summary: dict[str, dict[str, Any]] = {}
    for rec in records:
        entry = summary.setdefault(rec["workload"], {}).setdefault(
            rec["framework"], {"metrics": {}, "errors": []}
        )
        if "error" in rec:
            entry["errors"].append(rec["error"])
            continue
        for m in METRICS:
            if rec.get(m) is not None and not (m.startswith("import") and rec["imports_shared"]):
                entry["metrics"].setdefault(m, []).append(rec[m])
    for per_fw in summary.values():
        for entry in per_fw.values():
            entry["metrics"] = {m: stats(v) for m, v in entry["metrics"].items()}
        floor = per_fw.get("jax", {}).get("metrics", {})
        for entry in per_fw.values():
            entry["ratio"] = {
                m: s["median"] / floor[m]["median"]
                for m, s in entry["metrics"].items()
                if m in floor and floor[m]["median"] > 0
            }
    return summary
