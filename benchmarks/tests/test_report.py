"""The harness's bookkeeping on synthetic results: the round-robin plan, statistics, ratios,
targets, merges, Markdown, the docs refresh and skip reasons."""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report, run, summary
from benchmarks.workloads.spec import workloads

ROOT = Path(__file__).resolve().parents[2]


# --- the harness -----------------------------------------------------------------------------


def test_plan_alternates_frameworks_round_robin() -> None:
    jobs = run.plan(["a", "b", "c"], ["w1", "w2"], repeats=3, grouped=False)
    assert len(jobs) == 3 * 2 * 3
    for start in range(0, len(jobs), 3):  # each (repeat, workload) runs every framework once
        group = jobs[start : start + 3]
        assert sorted(fw for fw, _ in group) == ["a", "b", "c"]
        assert len({tuple(names) for _, names in group}) == 1
    firsts = [jobs[i][0] for i in range(0, len(jobs), 6)]  # the first of each repeat rotates
    assert firsts == ["a", "b", "c"]
    grouped = run.plan(["a", "b"], ["w1", "w2"], repeats=2, grouped=True)
    assert grouped == [("a", ["w1", "w2"]), ("b", ["w1", "w2"])] * 1 + [
        ("b", ["w1", "w2"]),
        ("a", ["w1", "w2"]),
    ]


def _record(fw: str, wl: str, first: float, step: float, shared: bool = False) -> dict:
    return {
        "jit_total_s": first / 2,
        "framework": fw,
        "workload": wl,
        "import_s": 2.0,
        "import_framework_s": 0.5,
        "import_jax_s": 1.0,
        "import_optax_s": 0.5,
        "imports_shared": shared,
        "first_call_s": first,
        "step_tiny_s": step,
        "params": 10,
    }


def test_summarise_takes_medians_ranges_and_ratios_to_plain_jax() -> None:
    records = [
        _record("jax", "w", 1.0, 0.010),
        _record("jax", "w", 3.0, 0.030),
        _record("jax", "w", 2.0, 0.020),
        _record("treemod", "w", 2.2, 0.021),
        _record("treemod", "w", 1.8, 0.019, shared=True),
        {"framework": "treemod", "workload": "w", "error": "RuntimeError: boom"},
    ]
    s = summary.summarise(records)
    jax_first = s["w"]["jax"]["metrics"]["first_call_s"]
    assert jax_first == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    tm = s["w"]["treemod"]
    assert tm["metrics"]["first_call_s"]["median"] == pytest.approx(2.0)
    assert tm["ratio"]["first_call_s"] == pytest.approx(1.0)
    assert tm["ratio"]["step_tiny_s"] == pytest.approx(1.0)
    assert tm["metrics"]["import_s"]["n"] == 1  # a shared import is not a fresh-process figure
    assert tm["errors"] == ["RuntimeError: boom"]


@functools.cache
def _machine() -> dict[str, Any]:
    """`run.machine()`, asked once: it starts a Python process to name the accelerator (~1 s)."""
    return run.machine()


def _data(frameworks: dict[str, str], records: list[dict]) -> dict[str, Any]:
    specs = workloads(quick=True)
    names = sorted({r["workload"] for r in records})
    status = {fw: {"label": fw, "status": st} for fw, st in frameworks.items()}
    for fw, st in status.items():
        if st["status"] == "skipped":
            st["reason"] = f"{fw} is not installed (`pip install {fw}`, or `make bench`)"
    meta = {
        "mode": "quick",
        "repeats": 1,
        "processes": "one per framework",
        "started": "t0",
        "finished": "t1",
        "duration_s": 60.0,
        "machine": copy.deepcopy(_machine()),
    }
    ok = [fw for fw, st in frameworks.items() if st != "skipped"]
    data = run._assemble(meta, status, specs, names, ok, records)
    data["targets"] = report.targets(data)
    return data


def test_targets_compare_treemod_with_plain_jax_peers_and_its_own_depth() -> None:
    records = [
        _record("jax", "stack4_scan", 1.0, 0.010),
        _record("treemod", "stack4_scan", 1.04, 0.012),
        _record("equinox", "stack4_scan", 1.5, 0.030),
        _record("jax", "stack48_scan", 1.2, 0.100),
        _record("treemod", "stack48_scan", 1.3, 0.100),
        _record("equinox", "stack48_scan", 1.25, 0.300),
    ]
    data = _data({"jax": "ok", "treemod": "ok", "equinox": "ok"}, records)
    got = {t["name"]: (round(t["value"], 3), t["ok"]) for t in data["targets"]}
    assert got["stack4_scan: first call / plain JAX"] == (1.04, True)
    assert got["stack4_scan: tiny-batch step / plain JAX"] == (1.2, False)
    assert got["stack48_scan: first call / plain JAX"] == (round(1.3 / 1.2, 3), False)
    assert got["stack48_scan: first call / fastest peer (Equinox)"] == (1.04, False)
    assert got["Stack: trace+lower+compile, 48 blocks / 4"] == (1.25, True)


def test_targets_pair_the_libraries_repeat_by_repeat_skipping_failed_processes() -> None:
    def rec(fw: str, process: int, first: float) -> dict:
        return {**_record(fw, "mlp8", first, 0.001), "process": process}

    records = [
        rec("jax", 0, 1.0),
        rec("treemod", 1, 1.1),
        rec("jax", 3, 2.0),
        {"framework": "treemod", "workload": "mlp8", "error": "timed out", "process": 4},
        rec("jax", 6, 4.0),
        rec("treemod", 7, 3.0),
    ]
    data = _data({"jax": "ok", "treemod": "ok"}, records)
    first = next(t for t in data["targets"] if t["name"] == "mlp8: first call / plain JAX")
    assert first["value"] == pytest.approx(2.05 / 2.0)  # ratio of medians: the verdict
    # Repeat 1: 1.1 / 1.0; repeat 2 lost treemod's process; repeat 3: 3.0 / 4.0.
    assert first["per_repeat"] == pytest.approx(
        {"median": 0.925, "min": 0.75, "max": 1.1, "n": 2, "within": 1}
    )
    assert "| 0.93× <small>[0.75–1.10]</small>, 1 of 2 |" in report.markdown(data)


def test_merged_targets_pair_repeats_within_the_run_that_gave_the_figures() -> None:
    def run_of(started: str, tm_first: list[float]) -> dict[str, Any]:
        records = []
        for k, first in enumerate(tm_first):
            records += [
                {**_record("jax", "mlp8", 1.0, 0.1), "process": 2 * k},
                {**_record("treemod", "mlp8", first, 0.1), "process": 2 * k + 1},
            ]
        data = _data({"jax": "ok", "treemod": "ok"}, records)
        data["meta"]["started"] = started
        return data

    merged = report.merge(
        [run_of("2026-11-22T10:00", [5.0, 5.0]), run_of("2026-11-22T13:00", [0.9, 1.2, 1.0])]
    )
    first = next(t for t in merged["targets"] if t["name"] == "mlp8: first call / plain JAX")
    assert first["per_repeat"] == pytest.approx(
        {"median": 1.0, "min": 0.9, "max": 1.2, "n": 3, "within": 2}
    )


def test_markdown_shows_tables_skip_reasons_failures_and_targets(tmp_path: Path) -> None:
    records = [
        _record("jax", "mlp8", 1.0, 0.001),
        _record("treemod", "mlp8", 1.02, 0.00105),
        {"framework": "nnx", "workload": "mlp8", "error": "ImportError: no flax"},
        {"framework": "equinox", "workload": "mlp8", "error": "timed out after 600 s"},
    ]
    data = _data(
        {"jax": "ok", "treemod": "ok", "haiku": "skipped", "nnx": "ok", "equinox": "ok"}, records
    )
    md = report.markdown(data)
    assert "| MLP, depth 8 | 1.00 | 1.02 (1.02×) | timed out (600 s) | failed |" in md
    assert "**haiku**: skipped: haiku is not installed (`pip install haiku`" in md
    assert "**nnx**: failed: ImportError: no flax" in md
    assert "| mlp8: first call / plain JAX | 1.02× | ≤ 1.05× | yes | 1.02× " in md
    assert "![First call of the training step (s, log scale)](first_call.png)" in md
    assert "step_big.png" not in md  # no realistic batch measured: no (empty) chart of it


def test_charts_leave_out_metrics_nobody_measured(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [_record("jax", "mlp8", 1.0, 0.001), _record("treemod", "mlp8", 1.1, 0.001)]
    data = _data({"jax": "ok", "treemod": "ok"}, records)
    written = {p.name for p in report.charts(data, tmp_path)}
    assert written == {"first_call.png", "step_tiny.png", "import.png"}


def test_merge_combines_runs_of_different_workloads() -> None:
    a = _data({"jax": "ok", "treemod": "ok"}, [_record("jax", "stack4_scan", 1.0, 0.1)])
    b = _data(
        {"jax": "ok", "treemod": "ok"},
        [_record("jax", "mlp8", 2.0, 0.1), _record("treemod", "mlp8", 2.2, 0.1)],
    )
    merged = report.merge([a, b])
    assert list(merged["workloads"]) == ["mlp8", "stack4_scan"]  # the suite's order
    assert len(merged["records"]) == 3 and {r["run"] for r in merged["records"]} == {0, 1}
    assert merged["summary"]["mlp8"]["treemod"]["ratio"]["first_call_s"] == pytest.approx(1.1)
    assert [r["workloads"] for r in merged["meta"]["runs"]] == [["stack4_scan"], ["mlp8"]]
    assert "Merged from runs: stack4_scan" in report.markdown(merged)


def test_merge_names_the_machine_of_each_run_when_they_differ() -> None:
    a = _data({"jax": "ok", "treemod": "ok"}, [_record("jax", "stack4_scan", 1.0, 0.1)])
    b = _data({"jax": "ok", "treemod": "ok"}, [_record("jax", "mlp8", 2.0, 0.1)])
    a["meta"]["started"], b["meta"]["started"] = "2026-11-22T10:00", "2026-11-24T10:00"
    same = report.markdown(report.merge([a, b]))
    assert same.count("Machine: ") == 1 and "Machines" not in same
    a["meta"]["machine"] = {**a["meta"]["machine"], "cpu": "AMD EPYC"}
    b["meta"]["machine"] = {**b["meta"]["machine"], "cpu": "Intel(R) Xeon(R) Processor"}
    text = report.markdown(report.merge([a, b]))
    assert "Machine: " not in text
    assert "runs of 2026-11-22T10:00 on AMD EPYC, " in text
    assert "runs of 2026-11-24T10:00 on Intel(R) Xeon(R) Processor, " in text


def test_merge_takes_a_remeasured_workload_from_the_latest_run_only() -> None:
    old = _data(
        {"jax": "ok", "treemod": "ok"},
        [
            _record("jax", "mlp8", 1.0, 0.1),
            _record("treemod", "mlp8", 1.5, 0.1),
            _record("jax", "stack4_scan", 1.0, 0.1),
        ],
    )
    new = _data(
        {"jax": "ok", "treemod": "ok"},
        [_record("jax", "mlp8", 2.0, 0.1), _record("treemod", "mlp8", 2.2, 0.1)],
    )
    old["meta"]["started"], new["meta"]["started"] = "2026-11-22T10:00", "2026-11-22T13:00"
    merged = report.merge([new, old])  # the order of the files does not matter
    assert merged["summary"]["mlp8"]["treemod"]["ratio"]["first_call_s"] == pytest.approx(1.1)
    assert sorted((r["workload"], r["run"]) for r in merged["records"]) == [
        ("mlp8", 0),
        ("mlp8", 0),
        ("stack4_scan", 1),
    ]
    assert [(r["workloads"], r["processes"]) for r in merged["meta"]["runs"]] == [
        (["stack4_scan"], 1),
        (["mlp8"], 2),
    ]
    text = report.markdown(merged)
    assert "Merged from runs: stack4_scan (2026-11-22T10:00, 1 at once, 1 process)" in text
    assert "planned processes" not in text


def test_stack_target_is_computed_within_one_run_only() -> None:
    deep = [_record(fw, "stack48_scan", 3.0, 0.1) for fw in ("jax", "treemod")]
    shallow = [_record(fw, "stack4_scan", 1.0, 0.1) for fw in ("jax", "treemod")]
    one_run = _data({"jax": "ok", "treemod": "ok"}, deep + shallow)
    assert any(t["name"].startswith("Stack:") for t in one_run["targets"])
    merged = report.merge(
        [
            _data({"jax": "ok", "treemod": "ok"}, deep),
            _data({"jax": "ok", "treemod": "ok"}, shallow),
        ]
    )
    assert not any(t["name"].startswith("Stack:") for t in merged["targets"])
    assert "The Stack target (48 blocks against 4) is not computed" in report.markdown(merged)


def _big(rec: dict, step: float) -> dict:
    return {**rec, "step_big_s": step, "init_jit_s": 5 * step}


def test_merge_keeps_metrics_that_the_latest_run_did_not_measure() -> None:
    old = _data(
        {"jax": "ok", "treemod": "ok"},
        [
            _big(_record("jax", "mlp8", 1.0, 0.1), 2.0),
            _big(_record("treemod", "mlp8", 1.5, 0.1), 3.0),
        ],
    )
    new = _data(
        {"jax": "ok", "treemod": "ok"},
        [_record("jax", "mlp8", 2.0, 0.1), _record("treemod", "mlp8", 2.2, 0.1)],
    )
    old["meta"]["started"], new["meta"]["started"] = "2026-11-22T10:00", "2026-11-22T13:00"
    merged = report.merge([new, old])
    tm = merged["summary"]["mlp8"]["treemod"]
    assert tm["ratio"]["first_call_s"] == pytest.approx(1.1)  # the new run's pair
    assert tm["ratio"]["step_big_s"] == pytest.approx(1.5)  # the old run's pair, not mixed
    assert tm["metrics"]["init_jit_s"]["median"] == pytest.approx(15.0)
    assert tm["source"]["first_call_s"] == 0 and tm["source"]["step_big_s"] == 1
    assert len(merged["records"]) == 4  # the old records still give the realistic batch
    text = report.markdown(merged)
    assert "mlp8 (construction inside jit, realistic batch only) (2026-11-22T10:00" in text
    assert "mlp8 (all but construction inside jit, realistic batch) (2026-11-22T13:00" in text
    assert "| MLP, depth 8 | 2.00 | 2.20 (1.10×) |" in text  # wall-time first call
    assert "| MLP, depth 8 | 2000 | 3000 (1.50×) |" in text  # realistic-batch step (ms)


def test_merge_keeps_the_failure_of_a_library_that_the_latest_run_left_out() -> None:
    timed_out = {"framework": "jax", "workload": "mlp8", "error": "timed out after 600 s"}
    old = _data({"jax": "ok", "treemod": "ok"}, [timed_out, _record("treemod", "mlp8", 5.0, 0.1)])
    new = _data({"treemod": "ok"}, [_record("treemod", "mlp8", 4.0, 0.1)])
    old["meta"]["started"], new["meta"]["started"] = "2026-11-22T10:00", "2026-11-22T13:00"
    merged = report.merge([old, new])
    assert merged["summary"]["mlp8"]["jax"]["errors"] == ["timed out after 600 s"]
    assert merged["summary"]["mlp8"]["treemod"]["metrics"]["first_call_s"]["median"] == 4.0
    assert merged["frameworks"]["jax"]["status"] == "failed"
    assert "| MLP, depth 8 | timed out (600 s) | 4.00 |" in report.markdown(merged)


def test_stack_target_of_a_merge_uses_the_run_that_measured_both_depths() -> None:
    both = [
        _record(fw, wl, first, 0.1)
        for fw in ("jax", "treemod")
        for wl, first in (("stack4_scan", 2.0), ("stack48_scan", 2.4))
    ]
    older = [_big(_record(fw, "stack48_scan", 9.0, 0.1), 1.0) for fw in ("jax", "treemod")]
    new, old = _data({"jax": "ok", "treemod": "ok"}, both), _data({"jax": "ok"}, older)
    old["meta"]["started"], new["meta"]["started"] = "2026-11-22T10:00", "2026-11-22T13:00"
    merged = report.merge([old, new])
    got = {t["name"]: t["value"] for t in merged["targets"]}
    assert got["Stack: trace+lower+compile, 48 blocks / 4"] == pytest.approx(1.2)
    assert "is not computed" not in report.markdown(merged)


def test_update_docs_replaces_only_the_generated_part(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nintro\n\n{report.BEGIN}\nold\n{report.END}\n\noutro\n")
    monkeypatch.setattr(report, "DOCS_PAGE", page)
    monkeypatch.setattr(report, "DOCS_IMG", tmp_path / "img")
    records = [_record("jax", "mlp8", 1.0, 0.001), _record("treemod", "mlp8", 1.0, 0.001)]
    data = _data({"jax": "ok", "treemod": "ok"}, records)
    (tmp_path / "first_call.png").write_bytes(b"png")
    report.update_docs(data, tmp_path)
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith("\n\noutro\n")
    assert "old" not in text and "### First call of the training step" in text
    assert "(img/bench/first_call.png)" in text
    assert (tmp_path / "img" / "first_call.png").read_bytes() == b"png"


def test_update_docs_without_markers_leaves_the_page_alone(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    monkeypatch.setattr(report, "DOCS_PAGE", page)
    monkeypatch.setattr(report, "DOCS_IMG", tmp_path / "img")
    data = _data({"jax": "ok"}, [_record("jax", "mlp8", 1.0, 0.001)])
    report.update_docs(data, tmp_path)
    assert page.read_text() == "# Benchmarks\n"


def test_charts_written_for_the_docs_are_their_only_copy(tmp_path: Path, monkeypatch) -> None:
    page, img, out = tmp_path / "benchmarks.md", tmp_path / "docs_img", tmp_path / "results"
    page.write_text(f"{report.BEGIN}\n{report.END}\n")
    monkeypatch.setattr(report, "DOCS_PAGE", page)
    monkeypatch.setattr(report, "DOCS_IMG", img)
    monkeypatch.setattr(report, "charts", lambda data, d: [d / "first_call.png"])
    records = [_record("jax", "mlp8", 1.0, 0.001), _record("treemod", "mlp8", 1.0, 0.001)]
    data = _data({"jax": "ok", "treemod": "ok"}, records)
    assert report.write(data, out, img) == [out / "results.md", img / "first_call.png"]
    # results.md links the charts where they are, relative to itself.
    assert "](../docs_img/first_call.png)" in (out / "results.md").read_text()
    (img / "first_call.png").write_bytes(b"png")
    assert report.update_docs(data, img) == [page]  # nothing copied
    assert "](img/bench/first_call.png)" in page.read_text()
    assert not any(out.glob("*.png"))


def test_results_folder_holds_the_latest_results_only() -> None:
    """Scripts live in benchmarks/experiments/, charts in docs/img/bench/ (one copy each)."""
    results = ROOT / "benchmarks" / "results"
    tracked = subprocess.run(
        ["git", "ls-files", "--", str(results)], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode != 0:  # not a git checkout (an sdist): nothing to check
        return
    names = {
        Path(line).relative_to("benchmarks/results").as_posix() for line in tracked.stdout.split()
    }
    kept = {".gitignore", "results.json", "results.md", "gpu/results.json", "gpu/results.md"}
    assert names <= kept, f"benchmarks/results/ holds more than the latest results: {names - kept}"
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    linked = set(re.findall(r"\]\(img/bench/([\w.]+\.png)\)", page))
    assert {"first_call.png", "step_tiny.png", "import.png"} <= linked
    for png in linked:
        assert (report.DOCS_IMG / png).read_bytes()[:4] == b"\x89PNG"
    charts = subprocess.run(
        ["git", "ls-files", "--", str(report.DOCS_IMG)], cwd=ROOT, capture_output=True, text=True
    )
    kept_charts = {Path(line).name for line in charts.stdout.split()}
    assert kept_charts == linked, "docs/img/bench/ holds the charts the page shows, no others"


def test_missing_peer_is_skipped_with_a_reason(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        run.importlib.util, "find_spec", lambda n, *a: None if n == "haiku" else real(n, *a)
    )
    reason = run.unavailable("haiku")
    assert reason is not None and "haiku is not installed" in reason and "dm-haiku" in reason
    assert run.unavailable("jax") is None


def test_unknown_workload_is_a_clear_cli_error(capsys) -> None:
    with pytest.raises(SystemExit):
        run.main(["--workloads", "mlp9", "--out", "/nonexistent"])
    err = capsys.readouterr().err
    assert "unknown workload or framework 'mlp9'" in err and "mlp8" in err
