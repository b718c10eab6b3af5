"""The DARTS supernet as a workload of the suite (`python -m benchmarks.run`): its sizes, its
batches, the report's row, and a smoke run of Flax Linen's and Haiku's compiled steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import report, run, worker
from benchmarks.workloads import darts_spec
from benchmarks.workloads.spec import darts_config, expected_params, suite, workloads

ROOT = Path(__file__).resolve().parents[2]
TITLE = "DARTS supernet, bilevel step"


def test_suite_runs_the_small_supernet_unless_quick_or_told() -> None:
    assert darts_config(suite()["darts"]) == darts_spec.DartsConfig.small()
    assert darts_config(suite(quick=True)["darts"]) == darts_spec.DartsConfig.tiny()
    assert darts_config(suite(darts_size="tiny")["darts"]) == darts_spec.DartsConfig.tiny()
    assert expected_params(suite()["darts"]) == darts_spec.expected_params(
        darts_spec.DartsConfig.small()
    )
    assert list(suite()) == [*workloads(), "darts"]  # the model workloads' builders never see it
    assert suite()["darts"].big_batch == 0  # one batch: the worker measures no realistic one


def test_unknown_darts_size_is_an_error_naming_the_sizes(capsys) -> None:
    with pytest.raises(ValueError, match="darts_size 'huge' is not one of 'small', 'tiny'"):
        suite(darts_size="huge")
    with pytest.raises(SystemExit):
        run.main(["--workloads", "darts", "--config", '{"darts_size": "huge"}'])
    assert "--config: darts_size 'huge' is not one of" in capsys.readouterr().err


def test_a_bilevel_batch_is_a_training_and_a_validation_half() -> None:
    w = suite(quick=True)["darts"]
    (xt, xv), (yt, yv) = worker._batch(w, w.tiny_batch, True)
    assert xt.shape == xv.shape == (2, 8, 8, 3) and yt.shape == yv.shape == (2,)
    assert not np.array_equal(xt, xv)
    assert all(0 <= int(v) < w.classes for v in [*yt, *yv])


def _fake_run(monkeypatch, tmp_path: Path, args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """`run.main(args)` with workers that only record what they were asked to run."""
    asked: list[str] = []

    def fake_job(framework: str, names: list[str], *rest: Any) -> list[dict[str, Any]]:
        asked.extend(names)
        return [{"framework": framework, "workload": n, "error": "not run"} for n in names]

    machine = {"cpu": "test", "cores": 2, "platform": "p", "python": "3", "versions": {}}
    monkeypatch.setattr(run, "run_job", fake_job)
    monkeypatch.setattr(run, "machine", lambda: machine)
    monkeypatch.setattr(report, "charts", lambda data, out: [])
    base = ["--frameworks", "jax", "--out", str(tmp_path), "--no-progress"]
    assert run.main([*base, *args]) == 0
    return asked, json.loads((tmp_path / "results.json").read_text())


def test_quick_run_measures_the_supernet_only_when_named(monkeypatch, tmp_path: Path) -> None:
    asked, _ = _fake_run(monkeypatch, tmp_path, ["--quick"])
    assert "darts" not in asked and "mlp8" in asked
    asked, data = _fake_run(monkeypatch, tmp_path, ["--quick", "--workloads", "darts"])
    assert asked == ["darts"]
    assert data["workloads"]["darts"]["params"] == 65606  # the tiny config's weights
    asked, data = _fake_run(monkeypatch, tmp_path, ["--workloads", "darts", "--repeats", "1"])
    assert data["workloads"]["darts"]["params"] == 136182  # the small config's


def _record(fw: str, first: float, step: float) -> dict[str, Any]:
    return {
        "framework": fw, "workload": "darts", "first_call_s": first, "first_call_cpu_s": first,
        "jit_total_s": first / 2, "trace_s": 0.1, "lower_s": 0.1, "compile_s": first / 2 - 0.2,
        "step_tiny_s": step, "step_tiny_cpu_s": step, "params": 136182, "import_s": 2.0,
        "import_framework_s": 0.5, "imports_shared": False, "process": {"jax": 0}.get(fw, 1),
    }  # fmt: skip


def test_report_and_targets_have_a_darts_row() -> None:
    records = [_record("jax", 100.0, 0.1), _record("treemod", 110.0, 0.1)]
    status = {fw: {"label": fw, "status": "ok"} for fw in ("jax", "treemod")}
    meta = {
        "mode": "full", "repeats": 1, "processes": "one per (framework, workload)",
        "started": "t0", "finished": "t1", "duration_s": 60.0,
        "machine": {"cpu": "test", "cores": 2, "platform": "p", "python": "3", "versions": {}},
    }  # fmt: skip
    data = run._assemble(meta, status, suite(), ["darts"], ["jax", "treemod"], records)
    data["targets"] = report.targets(data)
    md = report.markdown(data)
    assert f"| {TITLE} | 100 | 110 (1.10×) |" in md  # first call, wall time
    assert f"| {TITLE} | 100 | 100 (1.00×) |" in md  # steady step (ms)
    assert "| 136,182 |" in md and "one first-order bilevel step" in md
    targets = {t["name"]: t["ok"] for t in data["targets"]}
    assert targets["darts: first call / plain JAX"] is False
    assert targets["darts: tiny-batch step / plain JAX"] is True
    merged = report.merge([data, {**data, "meta": {**meta, "started": "t2"}}])
    assert list(merged["workloads"]) == ["darts"]


@pytest.mark.slow
@pytest.mark.heavy  # fresh worker processes, each compiling a bilevel step for minutes
def test_quick_run_of_the_supernet_in_flax_linen_and_haiku(tmp_path: Path) -> None:
    missing = [fw for fw in ("linen", "haiku") if run.unavailable(fw)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`make bench`)")
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--frameworks", "linen,haiku"]
    cmd += ["--workloads", "darts", "--out", str(tmp_path), "--no-progress", "--jobs", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    for rec in data["records"]:
        assert "error" not in rec, (rec["framework"], rec.get("traceback"))
        assert rec["params"] == 65606  # asserted by the worker too
        assert rec["first_call_s"] >= rec["compile_s"] > 0 and 0 < rec["step_tiny_s"]
        # Seven steps on one batch: the training loss falls from about ln(10).
        assert math.isfinite(rec["loss"]) and rec["loss"] < rec["first_loss"] < 3.0
    assert f"| {TITLE} |" in (tmp_path / "results.md").read_text()
