"""The benchmark suite: workload sizes against PyTorch, the harness, and a `--quick` smoke run.

The smoke run uses only treemod and plain JAX (so it passes without the peers installed) on the
smallest workload; the harness logic (round-robin plan, statistics, ratios, targets, Markdown,
docs refresh, skip reasons) is tested on synthetic results.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
from benchmarks import report, run, same_program
from benchmarks.worker import COMPILE, LOWER, TRACE, CompileEvents
from benchmarks.workloads.spec import FRAMEWORKS, describe, expected_params, workloads

ROOT = Path(__file__).resolve().parents[2]


# --- the workloads ---------------------------------------------------------------------------


def _torch_params(w: Any) -> int:
    """The same architecture in PyTorch, counted by PyTorch (an independent reference)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    if w.kind == "mlp":
        layers = [nn.Linear(w.width, w.width)]
        layers += [nn.Linear(w.width, w.width) for _ in range(w.depth - 1)]
        model: Any = nn.Sequential(*layers, nn.Linear(w.width, w.classes))
    elif w.kind == "resnet":
        mods: list[Any] = [nn.Conv2d(3, w.widths[0], 3, padding=1, bias=False)]
        mods.append(nn.BatchNorm2d(w.widths[0]))
        cin = w.widths[0]
        for stage, (cout, n) in enumerate(zip(w.widths, w.blocks, strict=True)):
            for b in range(n):
                stride = 2 if stage > 0 and b == 0 else 1
                mods += [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)]
                mods += [nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)]
                if stride != 1 or cin != cout:
                    mods += [nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)]
                cin = cout
        model = nn.Sequential(*mods, nn.Linear(cin, w.classes))
    else:
        layer = nn.TransformerEncoderLayer(
            w.width, w.heads, w.mlp_ratio * w.width, w.dropout, norm_first=True
        )
        # One block, counted `depth` times (building 48 full-size blocks would be slow).
        model = nn.ModuleList(
            [
                nn.Embedding(w.vocab, w.width),
                nn.Embedding(w.seq, w.width),
                nn.LayerNorm(w.width),
                nn.Linear(w.width, w.classes),
            ]
        )
        block = sum(p.numel() for p in layer.parameters())
        return sum(p.numel() for p in model.parameters()) + w.depth * block
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", list(workloads()))
def test_expected_params_match_pytorch(name: str) -> None:
    w = workloads()[name]
    assert expected_params(w) == _torch_params(w)


def test_full_size_resnet18_has_the_published_parameter_count() -> None:
    # The CIFAR ResNet-18 (3x3 stem, widths 64-512): 11,173,962 trainable parameters.
    assert expected_params(workloads()["resnet18"]) == 11_173_962


@contextlib.contextmanager
def _default_promotion() -> Iterator[None]:
    """JAX's default promotion rules: the peers' code (and the plain-JAX workloads) are not
    written for this test suite's strict settings."""
    with (
        warnings.catch_warnings(),
        jax.numpy_dtype_promotion("standard"),
        jax.numpy_rank_promotion("allow"),
    ):
        warnings.simplefilter("ignore")
        yield


def _abstract_params(framework: str, w: Any) -> int:
    module = importlib.import_module(f"benchmarks.workloads.{_MODULE[framework]}")
    case = module.build(w)
    with _default_promotion():
        model = case.make_model_abstract(0)
        # Concrete zeros in place of the shapes, so the worker's own counting applies unchanged.
        model = jax.tree_util.tree_map(
            lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s,
            model,
        )
    return case.count_params(model)


_MODULE = {
    "jax": "jax_dicts",
    "treemod": "treemod_models",
    "equinox": "equinox_models",
    "nnx": "nnx_models",
    "linen": "linen_models",
    "haiku": "haiku_models",
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(workloads(quick=True)))
def test_every_framework_builds_the_same_parameter_count(framework: str, name: str) -> None:
    if run.unavailable(framework):
        pytest.skip(f"{framework}: {run.unavailable(framework)}")
    w = workloads(quick=True)[name]
    assert _abstract_params(framework, w) == expected_params(w), describe(w)


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
    s = run.summarise(records)
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
    for png in [*report.CHARTS, "import.png"]:
        assert f"](img/bench/{png})" in page
        assert (report.DOCS_IMG / png).read_bytes()[:4] == b"\x89PNG"


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


def test_compile_events_split_the_first_call_into_trace_lower_compile() -> None:
    events = CompileEvents()
    f = jax.jit(lambda x: jnp.sin(x) * 2.0 + 1.0)
    x = jnp.ones(3).block_until_ready()
    jax.monitoring.register_event_duration_secs_listener(events)
    try:
        f(x).block_until_ready()
        got = events.summary()
        events.reset()
        f(x).block_until_ready()  # cached: nothing is traced or compiled
        again = events.summary()
    finally:
        jax._src.monitoring.unregister_event_duration_listener(events)
    assert got["n_compiles"] == 1
    assert got["trace_s"] > 0 and got["lower_s"] > 0 and got["compile_s"] > 0
    assert again == {"trace_s": 0.0, "lower_s": 0.0, "compile_s": 0.0, "n_compiles": 0}
    assert {TRACE, LOWER, COMPILE} == {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }


def test_operation_count_counts_calls_and_region_bodies() -> None:
    x = jnp.ones(3)
    inner = jax.jit(jnp.sin)
    nested = jax.jit(lambda a: inner(a) * a).lower(x).as_text()
    reduced = jax.jit(lambda a: jnp.sum(a * a)).lower(x).as_text()
    assert same_program.operation_count(nested) == 3  # call, multiply; sine in the callee
    assert same_program.operation_count(reduced) == 4  # multiply, constant, reduce, its add


def test_same_program_captures_and_compiles_each_library_step(capsys) -> None:
    with _default_promotion():
        texts = same_program.capture_step_modules("mlp8", ["jax", "treemod"], quick=True)
    assert set(texts) == {"jax", "treemod"}
    for text in texts.values():
        assert "stablehlo.dot_general" in text
        assert same_program.operation_count(text) > 100
    assert "call @" in texts["treemod"]  # the layer cores are nested programs
    times = same_program.compile_times(texts, rounds=2)
    assert {k: len(v) for k, v in times.items()} == {"jax": 2, "treemod": 2}
    assert all(t > 0 for v in times.values() for t in v)
    with _default_promotion():
        assert same_program.main(["--quick", "--frameworks", "jax,treemod", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "mlp8: XLA compile" in out and "treemod" in out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp8", "transformer12"])
def test_only_steps_with_dropout_draw_random_numbers(name: str) -> None:
    """A step splits its key only where the workload needs one: every library does the same
    work (Flax NNX's step, whose keys live in the model, never splits one otherwise).

    Each library has one step for every workload, keyed on `Workload.random`, so the smallest
    workload without dropout and one with it check the property. The step is traced, not
    compiled, on an abstract model and optimiser state (`filter_eval_shape`): a random primitive
    in its jaxpr is what becomes a Threefry hash in the program."""
    from benchmarks.worker import _batch
    from benchmarks.workloads import MODULES

    w = workloads(quick=True)[name]
    assert w.random == (name == "transformer12")
    for fw in FRAMEWORKS:
        if run.unavailable(fw):
            continue
        with _default_promotion():
            case = importlib.import_module(MODULES[fw]).build(w)
            # Shapes only: tracing reads no values, and an eager build compiles every initialiser.
            carry = tm.filter_eval_shape(lambda case=case: case.make_carry(case.make_model(0)))
            x, y = _batch(w, w.tiny_batch, case.channels_last)
            # Non-array leaves (activations, dropout rates) are static, as in the libraries' jit.
            text = str(tm.filter_make_jaxpr(case.step)(carry, x, y)[0])
        drawn = "random_bits" in text or "random_split" in text or "threefry" in text
        assert drawn == w.random, f"{fw}/{name}"


@contextlib.contextmanager
def _persistent_cache(directory: Path) -> Iterator[None]:
    """JAX's persistent compilation cache on in `directory`, keeping every program."""
    from jax._src import compilation_cache

    names = (
        "jax_enable_compilation_cache",
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
    )
    before = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def test_same_program_refuses_programs_served_from_a_persistent_cache(tmp_path: Path) -> None:
    with _default_promotion(), _persistent_cache(tmp_path):
        same_program.capture_step_modules("mlp8", ["jax"], quick=True)  # fills the cache
        assert any(tmp_path.iterdir())
        with pytest.raises(RuntimeError, match=r"jax/mlp8: the first step compiled nothing"):
            same_program.capture_step_modules("mlp8", ["jax"], quick=True)
        jax.jit(lambda a: a @ a + 1.0)(jnp.ones((4, 4))).block_until_ready()
        with pytest.raises(RuntimeError, match="probe computation compiled nothing"):
            same_program.compile_times({}, rounds=1)


def test_same_program_rejects_an_unknown_framework(capsys) -> None:
    with pytest.raises(SystemExit):
        same_program.main(["--frameworks", "jax,pytorch"])
    assert "unknown framework 'pytorch'" in capsys.readouterr().err


# --- the smoke run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_with_treemod_and_plain_jax(tmp_path: Path) -> None:
    # One CPU device per worker, compiled at the suite's optimisation level 0 (the same
    # operations, compiled faster): the run's structure is tested here, not its figures.
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--frameworks", "jax,treemod"]
    cmd += ["--workloads", "mlp8", "--out", str(tmp_path), "--no-progress", "--jobs", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["mode"] == "quick" and data["meta"]["machine"]["cores"]
    assert data["meta"]["machine"]["versions"]["jax"] == jax.__version__
    recs = {r["framework"]: r for r in data["records"]}
    assert set(recs) == {"jax", "treemod"}
    for fw, rec in recs.items():
        assert "error" not in rec, (fw, rec.get("traceback"))
        assert rec["params"] == expected_params(workloads(quick=True)["mlp8"])
        assert rec["first_call_s"] >= rec["compile_s"] > 0 and rec["n_compiles"] >= 1
        assert 0 < rec["step_tiny_s"] < rec["first_call_s"]
        assert rec["import_s"] >= rec["import_jax_s"] > 0
    assert data["summary"]["mlp8"]["treemod"]["ratio"]["first_call_s"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "| workload | plain JAX | treemod |" in md
    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("first_call.png", "step_tiny.png", "step_big.png", "import.png"):
            assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"

    # An interrupted run: treemod's process is missing. --resume runs only that one.
    data["records"] = [r for r in data["records"] if r["framework"] == "jax"]
    data["meta"]["duration_s"] = 1000.0  # the time the interrupted part ran
    (tmp_path / "results.json").write_text(json.dumps(data))
    proc = subprocess.run(
        [*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((tmp_path / "results.json").read_text())
    assert [r["framework"] for r in again["records"]] == ["jax", "treemod"]
    assert again["records"][0] == recs["jax"]  # kept, not rerun
    assert again["records"][1]["first_call_s"] != recs["treemod"]["first_call_s"]
    assert again["meta"]["started"] == data["meta"]["started"]
    assert [r["kept_processes"] for r in again["meta"]["resumed"]] == [1]
    assert again["meta"]["completed_processes"] == 2
    assert 1000.0 < again["meta"]["duration_s"] < 1000.0 + 600  # both parts' running time


def test_resume_refuses_a_run_with_other_options(tmp_path: Path, capsys) -> None:
    base = ["--quick", "--frameworks", "jax", "--workloads", "mlp8", "--out", str(tmp_path)]
    with pytest.raises(SystemExit):
        run.main([*base, "--resume"])
    assert "there is no" in capsys.readouterr().err
    meta = {"repeats": 1, "mode": "quick", "config": run.QUICK_CONFIG, "started": "t"}
    partial = {
        "meta": meta,
        "frameworks": {"jax": {"status": "ok"}},
        "workloads": {"mlp8": {}},
        "records": [],
    }
    (tmp_path / "results.json").write_text(json.dumps(partial))
    with pytest.raises(SystemExit):
        run.main([*base, "--repeats", "3", "--resume"])
    err = capsys.readouterr().err
    assert "was run with repeats 1, not 3" in err and "same options" in err
