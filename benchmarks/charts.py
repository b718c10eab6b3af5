"""Charts of a suite run: grouped bars per workload and library (median, min-max whiskers),
and import times; written only where matplotlib is installed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .targets import framework_order, metric_stats
from .workloads.spec import LABELS

CHARTS = {
    "first_call.png": ("first_call_s", "First call of the training step (s, log scale)", True),
    "step_tiny.png": ("step_tiny_s", "Steady step time, tiny batch (ms, log scale)", True),
    "step_big.png": ("step_big_s", "Steady step time, realistic batch (ms, log scale)", True),
}


def measured(data: dict[str, Any], metric: str) -> bool:
    """Whether any library has a figure of `metric` on any workload."""
    return any(
        metric in entry["metrics"] for per in data["summary"].values() for entry in per.values()
    )


def charts(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """Grouped bar charts (median, min–max whiskers) of the metrics measured; nothing if
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no charts (pip install matplotlib)", file=sys.stderr)
        return []
    fws = framework_order(data)
    wls = list(data["workloads"])
    written = []
    for png, (metric, title, log) in CHARTS.items():
        if not measured(data, metric):
            continue
        scale = 1e3 if title.startswith("Steady") else 1.0
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(wls) + 2), 4.0))
        width = 0.8 / max(1, len(fws))
        for i, fw in enumerate(fws):
            xs, ys, lo, hi = [], [], [], []
            for j, wl in enumerate(wls):
                s = metric_stats(data, wl, fw, metric)
                if s:
                    xs.append(j + (i - (len(fws) - 1) / 2) * width)
                    ys.append(s["median"] * scale)
                    lo.append((s["median"] - s["min"]) * scale)
                    hi.append((s["max"] - s["median"]) * scale)
            ax.bar(xs, ys, width, yerr=[lo, hi], label=LABELS[fw], capsize=2)
        ax.set_xticks(range(len(wls)), [data["workloads"][w]["title"] for w in wls], rotation=20,
                      ha="right", fontsize=8)  # fmt: skip
        if log:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        fig.savefig(out_dir / png, dpi=90)
        plt.close(fig)
        written.append(out_dir / png)
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    bottoms = {"import_jax_s": "jax", "import_optax_s": "optax", "import_framework_s": "framework"}
    names, base = [], []
    for fw in fws:
        recs = [r for r in data["records"] if r["framework"] == fw and "import_s" in r
                and not r.get("imports_shared")]  # fmt: skip
        if recs:
            names.append(LABELS[fw])
            base.append({k: sorted(r[k] for r in recs)[len(recs) // 2] for k in bottoms})
    acc = [0.0] * len(names)
    for key, label in bottoms.items():
        vals = [b[key] for b in base]
        ax.bar(names, vals, bottom=acc, label=label)
        acc = [a + v for a, v in zip(acc, vals, strict=True)]
    ax.set_ylabel("s")
    ax.set_title("Import time, fresh process (median)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "import.png", dpi=90)
    plt.close(fig)
    written.append(out_dir / "import.png")
    return written
