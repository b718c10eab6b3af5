"""Compile events, the same-program comparison, and a `--quick` smoke run of the suite.

The smoke run uses only treemod and plain JAX (so it passes without the peers installed) on the
smallest workload."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from benchmarks import run, same_program
from benchmarks.worker import COMPILE, LOWER, TRACE, CompileEvents
from benchmarks.workloads.spec import expected_params, workloads

from bench_helpers import default_promotion

ROOT = Path(__file__).resolve().parents[2]


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
    with default_promotion():
        texts = same_program.capture_step_modules("mlp8", ["jax", "treemod"], quick=True)
    assert set(texts) == {"jax", "treemod"}
    for text in texts.values():
        assert "stablehlo.dot_general" in text
        assert same_program.operation_count(text) > 100
    assert "call @" in texts["treemod"]  # the layer cores are nested programs
    times = same_program.compile_times(texts, rounds=2)
    assert {k: len(v) for k, v in times.items()} == {"jax": 2, "treemod": 2}
    assert all(t > 0 for v in times.values() for t in v)
    with default_promotion():
        assert same_program.main(["--quick", "--frameworks", "jax,treemod", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "mlp8: XLA compile" in out and "treemod" in out


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
    with default_promotion(), _persistent_cache(tmp_path):
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
@pytest.mark.heavy  # runs the suite's harness in fresh processes
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
