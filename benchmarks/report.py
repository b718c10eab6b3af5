"""Render benchmark results (JSON from `benchmarks.run`) as Markdown tables and PNG charts.

    python -m benchmarks.report benchmarks/results/results.json [more.json ...] [--out DIR] [--docs]

Several files (runs that measured different workloads or frameworks) are merged into one
report, written with the merged `results.json` to `--out`. `--docs` writes the charts to
`docs/img/bench/` (the one copy the docs show) instead of `--out`, and replaces the generated
part of `docs/benchmarks.md` (between the `<!-- results:begin -->` and `<!-- results:end -->`
lines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from .charts import CHARTS, charts, measured
from .summary import summarise
from .targets import STACK_METRICS, framework_order, from_one_run, metric_stats, targets
from .workloads.spec import LABELS, suite

ROOT = Path(__file__).resolve().parent.parent
DOCS_PAGE = ROOT / "docs" / "benchmarks.md"
DOCS_IMG = ROOT / "docs" / "img" / "bench"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

# How a merged report names the metrics that a run measured only in part.
METRIC_GROUPS = {
    "init_jit_s": "construction inside jit",
    "first_call_big_s": "realistic batch",
    "step_big_s": "realistic batch",
    "step_big_cpu_s": "realistic batch",
}


def _fmt(x: float, unit: str) -> str:
    if unit == "ms":
        x *= 1e3
    if x == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{min(digits, 4)}f}"


def _failure(error: str) -> str:
    """A table cell for a process that gave no value: says whether it ran out of time."""
    if error.startswith("timed out after"):
        return "timed out (" + error.removeprefix("timed out after ") + ")"
    return "failed"


def _table(data: dict[str, Any], metric: str, unit: str, ranges: bool = True) -> str:
    fws = framework_order(data)
    head = "| workload | " + " | ".join(LABELS[f] for f in fws) + " |"
    rows = [head, "|" + " --- |" * (len(fws) + 1)]
    for wl, info in data["workloads"].items():
        cells = []
        for fw in fws:
            s = metric_stats(data, wl, fw, metric)
            errors = data["summary"].get(wl, {}).get(fw, {}).get("errors", [])
            if s is None:
                cells.append(_failure(errors[0]) if errors else "–")
                continue
            cell = _fmt(s["median"], unit)
            if ranges and s["n"] > 1:
                cell += f" <small>[{_fmt(s['min'], unit)}–{_fmt(s['max'], unit)}]</small>"
            ratio = data["summary"][wl][fw]["ratio"].get(metric)
            if ratio is not None and fw != "jax":
                cell += f" ({ratio:.2f}×)"
            cells.append(cell)
        rows.append(f"| {info['title']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _breakdown(data: dict[str, Any]) -> str:
    fws = framework_order(data)
    rows = ["| workload | " + " | ".join(LABELS[f] for f in fws) + " |"]
    rows.append("|" + " --- |" * (len(fws) + 1))
    for wl, info in data["workloads"].items():
        cells = []
        for fw in fws:
            parts = [metric_stats(data, wl, fw, m) for m in ("trace_s", "lower_s", "compile_s")]
            if any(p is None for p in parts):
                cells.append("–")
            else:
                cells.append(" / ".join(_fmt(p["median"], "s") for p in parts if p))
        rows.append(f"| {info['title']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _imports(data: dict[str, Any]) -> str:
    rows = ["| framework | total import (s) | of which the framework (s) | × plain JAX |"]
    rows.append("| --- | --- | --- | --- |")
    floor = None
    for fw in framework_order(data):
        vals = [
            r for r in data["records"] if r["framework"] == fw and "import_s" in r
            and not r.get("imports_shared")
        ]  # fmt: skip
        if not vals:
            continue
        tot = sorted(r["import_s"] for r in vals)[len(vals) // 2]
        own = sorted(r["import_framework_s"] for r in vals)[len(vals) // 2]
        floor = tot if fw == "jax" else floor
        ratio = f"{tot / floor:.2f}×" if floor else "–"
        lo, hi = min(r["import_s"] for r in vals), max(r["import_s"] for r in vals)
        rng = f" <small>[{lo:.2f}–{hi:.2f}]</small>"
        rows.append(
            f"| {LABELS[fw]} | {tot:.2f}{rng if len(vals) > 1 else ''} | {own:.2f} | {ratio} |"
        )
    return "\n".join(rows)


def _run_part(workload: str, partial: dict[str, list[str]] | None) -> str:
    """A workload in the list of merged runs, saying which of its metrics the run gave."""
    if partial is None:
        return workload
    if not partial["here"]:
        return f"{workload} (failures only)"
    names = lambda ms: ", ".join(dict.fromkeys(METRIC_GROUPS.get(m, m) for m in ms))
    if len(partial["here"]) <= len(partial["elsewhere"]):
        return f"{workload} ({names(partial['here'])} only)"
    return f"{workload} (all but {names(partial['elsewhere'])})"


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def markdown(data: dict[str, Any], img_prefix: str = "") -> str:
    """The report: machine, skipped frameworks, tables, targets, charts."""
    meta, mach = data["meta"], data["meta"]["machine"]
    done, planned = meta.get("completed_processes"), meta.get("planned_processes")
    progress = f" ({done} of {planned} planned processes completed)" if planned else ""
    stopped = f" Stopped early: {meta['stopped']}." if meta.get("stopped") else ""
    runs = ""
    if len(meta.get("runs", [])) > 1:
        runs = (
            " Merged from runs: "
            + "; ".join(
                ", ".join(_run_part(w, r.get("partial", {}).get(w)) for w in r["workloads"])
                + f" ({r['started']}, {r.get('jobs') or 1} at once"
                + (f", {_processes(r['processes'])}" if r.get("processes") is not None else "")
                + (f", stopped: {r['stopped']}" if r.get("stopped") else "")
                + ")"
                for r in meta["runs"]
            )
            + "."
        )
    at_once = "" if runs else f", {meta.get('jobs') or 1} process(es) at once"
    machines: dict[str, list[str]] = {}  # machine -> the runs made on it
    for r in meta.get("runs") or [{"machine": mach, "started": meta["started"]}]:
        machines.setdefault(_machine(r.get("machine") or mach), []).append(r["started"])
    if len(machines) == 1:
        where = f"Machine: {next(iter(machines))}."
    else:  # ratios stay within one run, hence one machine; the runs' machines are named
        where = (
            "Machines (ratios compare processes of one run, so of one machine): "
            + "; ".join(f"runs of {', '.join(starts)} on {m}" for m, starts in machines.items())
            + "."
        )
    lines = [
        f"Mode **{meta['mode']}**, up to {meta['repeats']} repeat(s), {meta['processes']}"
        f"{progress}{at_once}.{stopped}{runs}",
        "",
        f"Run "
        f"{meta['started']} – {meta.get('finished', '?')} "
        f"({meta.get('duration_s', 0) / 60:.1f} min).",
        "",
        f"{where} Load average before/after{' (latest run)' if runs else ''}: "
        f"{_load(mach.get('load_average'))} / {_load(meta.get('load_average_after'))}.",
        "",
    ]
    for st in data["frameworks"].values():
        if st["status"] != "ok":
            lines.append(f"- **{st['label']}**: {st['status']}: {st.get('reason', '')}")
    lines += ["", "Cells: median <small>[min–max]</small> (ratio of medians to plain JAX).", ""]
    sections = [
        ("First call of the training step, wall time (s)", "first_call_s", "s"),
        ("First call of the training step, CPU time of the process (s)", "first_call_cpu_s", "s"),
        ("Trace + lowering + XLA compile of the first call (s)", "jit_total_s", "s"),
        ("Steady-state step, tiny batch (ms)", "step_tiny_s", "ms"),
        ("Steady-state step, tiny batch, CPU time of the process (ms)", "step_tiny_cpu_s", "ms"),
        ("Steady-state step, realistic batch (ms)", "step_big_s", "ms"),
        ("Steady-state step, realistic batch, CPU time (ms)", "step_big_cpu_s", "ms"),
        ("Model construction, eager (s)", "init_s", "s"),
        ("Model construction under eval_shape (s)", "init_abstract_s", "s"),
        ("Model construction inside jit, first call (s)", "init_jit_s", "s"),
    ]
    for title, metric, unit in sections:
        if any(
            metric_stats(data, wl, fw, metric)
            for wl in data["workloads"]
            for fw in framework_order(data)
        ):
            lines += [f"#### {title}", "", _table(data, metric, unit), ""]
    lines += [
        "#### Trace / lowering / XLA compile of the first call (s, medians)",
        "",
        _breakdown(data),
        "",
        "#### Import time (fresh process)",
        "",
        _imports(data),
        "",
        "#### Parameter counts (asserted equal across frameworks)",
        "",
        "| workload | architecture | parameters |",
        "| --- | --- | --- |",
    ]
    for info in data["workloads"].values():
        lines.append(f"| {info['title']} | {info['description']} | {info['params']:,} |")
    if data.get("targets"):
        lines += [
            "",
            "#### treemod's targets",
            "",
            "Measured: the ratio of medians. Per repeat: the ratio within each repeat, median "
            "<small>[min–max]</small>, and in how many repeats it was within the limit.",
            "",
            "| target | measured | limit | met | per repeat |",
            "| --- | --- | --- | --- | --- |",
        ]
        for t in data["targets"]:
            mark = "yes" if t["ok"] else "**no**"
            lines.append(
                f"| {t['name']} | {t['value']:.2f}× | ≤ {t['limit']:.2f}× | {mark} | "
                f"{_per_repeat_cell(t.get('per_repeat'))} |"
            )
        if any(not from_one_run(data, m) for m, _ in STACK_METRICS):
            lines += [
                "",
                "The Stack target (48 blocks against 4) is not computed: the two come from "
                "different runs, and compile times are compared within one run only.",
            ]
    errors = [
        (wl, fw, e)
        for wl, per in data["summary"].items()
        for fw, entry in per.items()
        for e in sorted(set(entry["errors"]))
    ]
    if errors:
        lines += ["", "#### Failures", ""]
        lines += [f"- {LABELS[fw]} / {wl}: `{e[:300]}`" for wl, fw, e in errors]
    lines.append("")
    for png, (metric, title, _) in CHARTS.items():
        if measured(data, metric):  # a run without the realistic batch has no chart of it
            lines.append(f"![{title}]({img_prefix}{png})")
    lines.append(f"![Import time (s)]({img_prefix}import.png)")
    return "\n".join(lines) + "\n"


def _machine(mach: dict[str, Any]) -> str:
    """CPU, cores, platform, Python and library versions, in one line."""
    versions = ", ".join(f"{k} {val}" for k, val in mach["versions"].items() if val)
    device = f"; runs on {mach['accelerator']}" if mach.get("accelerator", "cpu") != "cpu" else ""
    return (
        f"{mach['cpu']}, {mach['cores']} cores{device}, {mach['platform']}, "
        f"Python {mach['python']}; {versions}"
    )


def _per_repeat_cell(s: dict[str, float] | None) -> str:
    if not s:
        return "–"
    return (
        f"{s['median']:.2f}× <small>[{s['min']:.2f}–{s['max']:.2f}]</small>, "
        f"{s['within']} of {s['n']}"
    )


def _load(x: list[float] | None) -> str:
    return "/".join(f"{v:.1f}" for v in x) if x else "?"


# --- charts ----------------------------------------------------------------------------------


def write(data: dict[str, Any], out_dir: Path, img_dir: Path | None = None) -> list[Path]:
    """Write `results.md` into `out_dir` and the charts into `img_dir` (default: `out_dir`).

    `results.md` links the charts by their path relative to `out_dir`. Return the paths written.
    """
    img_dir = out_dir if img_dir is None else img_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(img_dir.resolve(), out_dir.resolve())
    prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
    md = "# Benchmark results\n\n" + markdown(data, img_prefix=prefix)
    (out_dir / "results.md").write_text(md)
    return [out_dir / "results.md", *charts(data, img_dir)]


def update_docs(data: dict[str, Any], img_dir: Path) -> list[Path]:
    """Replace the generated part of docs/benchmarks.md; copy the charts from `img_dir` to
    docs/img/bench unless they were written there (the one copy the docs show)."""
    written = []
    if img_dir.resolve() != DOCS_IMG.resolve():
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for png in [*CHARTS, "import.png"]:
            if (img_dir / png).exists():
                shutil.copy(img_dir / png, DOCS_IMG / png)
                written.append(DOCS_IMG / png)
    page = DOCS_PAGE.read_text()
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        body = markdown(data, img_prefix="img/bench/").replace("#### ", "### ")
        DOCS_PAGE.write_text(f"{head}{BEGIN}\n{body}{END}{tail}")
        written.append(DOCS_PAGE)
    else:
        print(f"{DOCS_PAGE} has no {BEGIN} ... {END} markers: not updated", file=sys.stderr)
    return written


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine several runs' results (workloads or metrics measured in separate runs) into one.

    Each metric of a workload comes from the latest run that measured it, for every framework
    at once, so a re-measured cell replaces the older figures instead of mixing with them and
    its ratios stay within one run. A run that measured only some metrics of a workload (for
    example without the realistic batch) leaves the others to the run before. A library's
    failures on a workload come from the latest run that ran it there.
    """
    order = list(suite())
    by_start = sorted(range(len(docs)), key=lambda n: docs[n]["meta"]["started"])
    runs = {n: summarise(docs[n]["records"]) for n in by_start}
    source: dict[tuple[str, str], int] = {}  # (workload, metric) -> the run it comes from
    owner: dict[tuple[str, str], int] = {}  # (workload, framework) -> its latest run
    for n in by_start:
        owner.update({(w, fw): n for w, per_fw in runs[n].items() for fw in per_fw})
        for wl, per_fw in runs[n].items():
            source.update({(wl, m): n for entry in per_fw.values() for m in entry["metrics"]})
    summary: dict[str, dict[str, Any]] = {}
    for (wl, fw), last in owner.items():
        entry = {"metrics": {}, "ratio": {}, "source": {}, "errors": runs[last][wl][fw]["errors"]}
        for (w, m), n in source.items():
            got = runs[n][wl].get(fw) if w == wl else None
            if got is not None and m in got["metrics"]:
                entry["metrics"][m] = got["metrics"][m]
                entry["source"][m] = n
                if m in got["ratio"]:
                    entry["ratio"][m] = got["ratio"][m]
        summary.setdefault(wl, {})[fw] = entry
    used = {(w, n) for (w, _), n in source.items()}
    records = [
        {**r, "run": n}
        for n in by_start
        for r in docs[n]["records"]
        if (r["workload"], n) in used or owner[r["workload"], r["framework"]] == n
    ]
    used |= {(r["workload"], r["run"]) for r in records}
    status: dict[str, dict[str, Any]] = {}
    for n in by_start:
        for fw, st in docs[n]["frameworks"].items():
            if fw not in status or st["status"] == "ok":
                status[fw] = dict(st)
    for fw, st in status.items():
        errs = [e for per in summary.values() for e in per.get(fw, {}).get("errors", [])]
        if st["status"] != "skipped" and any(fw in per for per in summary.values()):
            has_values = any(per.get(fw, {}).get("metrics") for per in summary.values())
            st["status"] = "ok" if not errs else "partly failed" if has_values else "failed"
            if errs:
                st["reason"] = errs[0]
            else:
                st.pop("reason", None)
    used_runs = [n for n in by_start if any(m == n for _, m in used)]
    meta = dict(docs[used_runs[-1]]["meta"])
    meta["runs"] = [
        {
            k: docs[n]["meta"].get(k)
            for k in ("started", "finished", "jobs", "config", "stopped", "machine")
        }
        | {
            "workloads": [w for w in order if (w, n) in used],
            "partial": {
                w: {
                    "here": sorted(m for (x, m), k in source.items() if x == w and k == n),
                    "elsewhere": sorted(m for (x, m), k in source.items() if x == w and k != n),
                }
                for w in order
                if (w, n) in used and any(x == w and k != n for (x, _), k in source.items())
            },
            "processes": sum(r["run"] == n for r in records),
        }
        for n in used_runs
    ]
    meta["repeats"] = max(docs[n]["meta"]["repeats"] for n in used_runs)
    meta["started"] = min(docs[n]["meta"]["started"] for n in used_runs)
    meta["finished"] = max(
        docs[n]["meta"].get("finished") or docs[n]["meta"]["started"] for n in used_runs
    )
    meta["duration_s"] = sum(docs[n]["meta"].get("duration_s", 0.0) for n in used_runs)
    meta["completed_processes"] = len(records)
    meta["planned_processes"] = None
    meta.pop("stopped", None)
    data = {
        "meta": meta,
        "frameworks": status,
        "workloads": {
            w: next(
                docs[n]["workloads"][w] for n in reversed(by_start) if w in docs[n]["workloads"]
            )
            for w in order
            if any(x == w for x, _ in owner)
        },
        "records": records,
        "summary": summary,
    }
    data["targets"] = targets(data)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("results", nargs="+", help="results.json files written by benchmarks.run")
    parser.add_argument("--out", default=None, help="directory (default: the first file's)")
    parser.add_argument("--docs", action="store_true", help="also refresh docs/benchmarks.md")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.results]
    docs = [json.loads(p.read_text()) for p in paths]
    data = merge(docs) if len(docs) > 1 else docs[0]
    data["targets"] = targets(data)
    out = Path(args.out) if args.out else paths[0].parent
    out.mkdir(parents=True, exist_ok=True)
    if len(docs) > 1:
        (out / "results.json").write_text(json.dumps(data, indent=1))
    img_dir = DOCS_IMG if args.docs else out  # the docs' charts: one copy, in docs/img/bench
    written = write(data, out, img_dir)
    if args.docs:
        written += update_docs(data, img_dir)
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
