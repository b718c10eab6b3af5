"""Run the compile-speed benchmark suite: every framework on every workload, fresh processes.

    python -m benchmarks.run [--quick] [--frameworks jax,treemod,...] [--workloads mlp8,...]
                             [--repeats N] [--out DIR] [--no-docs] [--resume]

Each (framework, workload, repeat) runs in a fresh Python process (`benchmarks.worker`) with
the persistent compilation cache off, so every import and every compile is cold. Repeats go
round-robin: within a repeat the frameworks take turns on each workload, starting from a
different one each time, so slow phases of the machine spread over all of them. Frameworks
that are not installed are skipped with the reason shown. `--quick` uses tiny models, one
repeat and one process per framework (all workloads in it), as a smoke test. The DARTS
supernet (workload `darts`, each library's bilevel step) runs its small config, or its tiny one
with `--config '{"darts_size": "tiny"}'` or with `--quick`, which runs it only when named
(`--quick --workloads darts`: its compile takes minutes even so).

A run writes its results after every process; `--resume` continues an interrupted one.
Results go to `DIR/results.json` (every measurement, the summary and the machine), a Markdown
report `DIR/results.md` and PNG charts. A full run into the default directory
(`benchmarks/results/`) also refreshes the tables of `docs/benchmarks.md`, and writes its charts
to `docs/img/bench/` (the only copy) instead of beside the results.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .summary import summarise
from .workloads.spec import (
    DISTRIBUTIONS,
    FRAMEWORKS,
    LABELS,
    REQUIRES,
    describe,
    expected_params,
    suite,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results"


QUICK_CONFIG = {
    "tiny_iters": 5,
    "tiny_samples": 2,
    "tiny_iters_heavy": 2,
    "big_iters": 2,
    "big_samples": 1,
    "init_jit_workloads": ["mlp8"],
    "big_workloads": ["mlp8"],
}
FULL_CONFIG = {"tiny_iters": 20, "tiny_samples": 5, "big_iters": 3, "big_samples": 3}


def unavailable(framework: str) -> str | None:
    """Why `framework` cannot run here, or None. Looks for packages without importing them."""
    for name in REQUIRES[framework]:
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is None:
            dist = DISTRIBUTIONS.get(framework, top)
            return f"{top} is not installed (`pip install {dist}`, or `make bench`)"
    return None


def plan(
    frameworks: list[str], names: list[str], repeats: int, grouped: bool
) -> list[tuple[str, list[str]]]:
    """The jobs in run order: (framework, workloads), frameworks alternating round-robin."""
    jobs: list[tuple[str, list[str]]] = []
    n = len(frameworks)
    for r in range(repeats):
        if grouped:
            jobs += [(frameworks[(r + i) % n], list(names)) for i in range(n)]
            continue
        for j, name in enumerate(names):
            jobs += [(frameworks[(r + j + i) % n], [name]) for i in range(n)]
    return jobs


def machine() -> dict[str, Any]:
    """CPU model, cores, Python and library versions, load average."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for dist in ("jax", "jaxlib", "optax", "numpy", "treemod", "equinox", "flax", "dm-haiku"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu": cpu,
        "accelerator": accelerator(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def accelerator() -> str:
    """The device the workers run on (JAX_PLATFORMS decides), as JAX names it: "cpu", or the
    GPU's model. Asked in a subprocess, so that this process never initialises a backend."""
    code = "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind, sep=': ')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return f"unknown ({(proc.stderr.strip().splitlines() or ['no output'])[-1]})"
    platform_name, _, kind = lines[-1].partition(": ")
    return platform_name if platform_name == "cpu" else f"{platform_name}: {kind}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    # Fake device counts from test set-ups would change what XLA compiles.
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_job(
    framework: str, names: list[str], quick: bool, config: dict[str, Any], timeout: float
) -> list[dict[str, Any]]:
    """Run one worker process and return its records (an error record if it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "benchmarks.worker", "--framework", framework]
        cmd += ["--workloads", ",".join(names), "--config", json.dumps(config), "--out", str(out)]
        if quick:
            cmd.append("--quick")
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
            )
            failure = (
                None
                if out.exists()
                else f"worker exited {proc.returncode}: "
                + (proc.stderr.strip().splitlines() or ["no output"])[-1]
            )
        except subprocess.TimeoutExpired:
            failure = f"timed out after {timeout:.0f} s"
        if failure is not None:
            return [{"framework": framework, "workload": n, "error": failure} for n in names]
        records: list[dict[str, Any]] = json.loads(out.read_text())
        return records


def _tagged(n: int, *args: Any) -> list[dict[str, Any]]:
    records = run_job(*args)
    for rec in records:
        rec["process"] = n
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny models, a smoke run (<2 min)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--workloads", default=None, help="comma-separated (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (quick: 1)")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument(
        "--config",
        default="{}",
        help="JSON overrides of the worker settings (benchmarks/worker.py's DEFAULTS), e.g. "
        '\'{"darts_size": "tiny"}\' for the DARTS supernet\'s tiny config (default: small; '
        "tiny with --quick)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help="start no new process after this many minutes, and stop those still running ten "
        "minutes later (the results so far are kept)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes at once (default 1, quick: 2); more finishes sooner on a machine "
        "with idle cores, but then only the CPU-time figures are comparable",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run whose partial results.json is in --out: keep its processes and "
        "run only the planned ones it lacks (same frameworks, workloads, repeats and config)",
    )
    parser.add_argument("--no-docs", action="store_true", help="do not refresh docs/")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    config = {**(QUICK_CONFIG if args.quick else FULL_CONFIG), **json.loads(args.config)}
    try:
        specs = suite(args.quick, config.get("darts_size"))
    except ValueError as err:
        parser.error(f"--config: {err}")
    # The DARTS supernet's tiny step still compiles for minutes: a quick run runs it when named.
    names = (
        args.workloads.split(",")
        if args.workloads
        else [n for n, w in specs.items() if not (args.quick and w.kind == "darts")]
    )
    wanted = args.frameworks.split(",")
    for bad in [n for n in names if n not in specs] + [f for f in wanted if f not in FRAMEWORKS]:
        parser.error(
            f"unknown workload or framework {bad!r}; workloads: {', '.join(specs)}; "
            f"frameworks: {', '.join(FRAMEWORKS)}"
        )
    repeats = args.repeats or (1 if args.quick else 5)
    args.jobs = args.jobs or (2 if args.quick else 1)
    if args.jobs > 1:  # on a GPU each worker would otherwise take 75% of its memory at start
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    out_dir = Path(args.out) if args.out else DEFAULT_OUT / ("quick" if args.quick else "")

    status: dict[str, dict[str, Any]] = {}
    frameworks = []
    for fw in wanted:
        reason = unavailable(fw)
        status[fw] = {"label": LABELS[fw], "status": "skipped" if reason else "ok"}
        if reason:
            status[fw]["reason"] = reason
            print(f"skipping {LABELS[fw]}: {reason}", file=sys.stderr)
        else:
            frameworks.append(fw)

    meta: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "repeats": repeats,
        "processes": "one per framework" if args.quick else "one per (framework, workload)",
        "config": config,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    jobs = plan(frameworks, names, repeats, grouped=args.quick)
    meta["planned_processes"] = len(jobs)
    records: list[dict[str, Any]] = []
    if args.resume:
        try:
            meta, records = resumed(out_dir / "results.json", meta, frameworks, names)
        except ValueError as err:
            parser.error(str(err))
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta["jobs"] = args.jobs
    bar = _progress(len(jobs), args.no_progress)
    finished_before = {r["process"] for r in records}
    done = len(finished_before)
    bar.update(done)
    pool = concurrent.futures.ThreadPoolExecutor(max(1, args.jobs))
    pending: list[concurrent.futures.Future] = []
    try:
        for n, (fw, job_names) in enumerate(jobs):
            if n in finished_before:
                continue
            while len(pending) >= max(1, args.jobs):  # wait for a free slot
                finished, _ = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for fut in finished:
                    pending.remove(fut)
                    records.extend(fut.result())
                    done += 1
                    bar.update(1)
                partial = _assemble(meta, status, specs, names, frameworks, records)
                (out_dir / "results.json").write_text(json.dumps(partial, indent=1))
            if args.budget_min is not None and time.perf_counter() - t0 > 60 * args.budget_min:
                meta["stopped"] = f"time budget of {args.budget_min:g} min reached"
                break
            bar.set_description(f"{LABELS[fw]:<10} {','.join(job_names)[:24]:<24}")
            timeout = args.timeout
            if args.budget_min is not None:  # processes still running 10 min after it stop
                timeout = min(timeout, 60 * (args.budget_min + 10) - (time.perf_counter() - t0))
            pending.append(pool.submit(_tagged, n, fw, job_names, args.quick, config, timeout))
        for fut in concurrent.futures.as_completed(pending):
            records.extend(fut.result())
            done += 1
            bar.update(1)
    except KeyboardInterrupt:
        meta["stopped"] = "interrupted"
        pool.shutdown(wait=False, cancel_futures=True)
    pool.shutdown(wait=False)
    records.sort(key=lambda r: r["process"])
    bar.close()
    meta["completed_processes"] = done
    # A resumed run adds its time to that of the runs before (not the pause between them).
    meta["duration_s"] = meta.get("duration_s", 0.0) + time.perf_counter() - t0
    meta["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    meta["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    data = _assemble(meta, status, specs, names, frameworks, records)
    from . import report  # matplotlib loads only now

    data["targets"] = report.targets(data)
    (out_dir / "results.json").write_text(json.dumps(data, indent=1))
    # A full run into the default directory refreshes the docs; its charts go straight to
    # docs/img/bench (one copy). Other runs keep their charts beside their results.
    docs = not args.quick and args.out is None and not args.no_docs
    img_dir = report.DOCS_IMG if docs else out_dir
    written = report.write(data, out_dir, img_dir)
    if docs:
        written += report.update_docs(data, img_dir)
    print(f"wrote {', '.join(str(p) for p in [out_dir / 'results.json', *written])}")
    for st in data["frameworks"].values():
        if st["status"] != "ok":
            print(f"{st['label']}: {st['status']}: {st.get('reason', '')}", file=sys.stderr)
    return 0


def resumed(
    path: Path, meta: dict[str, Any], frameworks: list[str], names: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The metadata and records of the interrupted run at `path`, to be continued.

    Raises ValueError naming what differs when `path` is missing or holds another plan.
    """
    if not path.exists():
        raise ValueError(f"--resume: there is no {path} to continue")
    old = json.loads(path.read_text())
    before = old["meta"]
    ran = {fw for fw, st in old["frameworks"].items() if st["status"] != "skipped"}
    for what, was, now in [
        ("repeats", before["repeats"], meta["repeats"]),
        ("mode", before["mode"], meta["mode"]),
        ("config", before["config"], meta["config"]),
        ("frameworks", sorted(ran), sorted(frameworks)),
        ("workloads", list(old["workloads"]), names),
    ]:
        if was != now:
            raise ValueError(
                f"--resume: {path} was run with {what} {was!r}, not {now!r}; pass the same "
                "options as the interrupted run, or drop --resume to start afresh"
            )
    resumption = {
        "at": meta["started"],
        "kept_processes": len({r["process"] for r in old["records"]}),
        "machine": meta["machine"],
    }
    kept = {**meta, "started": before["started"], "machine": before["machine"]}
    kept["duration_s"] = before.get("duration_s", 0.0)
    kept["resumed"] = [*before.get("resumed", []), resumption]
    return kept, old["records"]


def _assemble(
    meta: dict[str, Any],
    status: dict[str, dict[str, Any]],
    specs: dict[str, Any],
    names: list[str],
    frameworks: list[str],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    """The results document: metadata, framework status, workloads, records and summary."""
    status = {fw: dict(st) for fw, st in status.items()}
    for fw in frameworks:
        mine = [r for r in records if r["framework"] == fw]
        errs = [r["error"] for r in mine if "error" in r]
        if errs:
            status[fw]["status"] = "failed" if len(errs) == len(mine) else "partly failed"
            status[fw]["reason"] = errs[0]
    return {
        "meta": dict(meta),
        "frameworks": status,
        "workloads": {
            n: {
                "title": specs[n].title,
                "description": describe(specs[n]),
                "params": expected_params(specs[n]),
            }
            for n in names
        },
        "records": records,
        "summary": summarise(records),
    }


class _NoBar:
    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0

    def set_description(self, text: str) -> None:
        print(f"[{self.n + 1}/{self.total}] {text.strip()}", file=sys.stderr, flush=True)

    def update(self, n: int) -> None:
        self.n += n

    def close(self) -> None:
        pass


def _progress(total: int, disabled: bool) -> Any:
    if not disabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="process", dynamic_ncols=True)
        except ImportError:
            pass
    return _NoBar(total)


if __name__ == "__main__":
    sys.exit(main())
