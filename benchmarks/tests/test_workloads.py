"""The benchmark workloads: sizes against PyTorch, the same parameter count in every library,
and random numbers drawn only by the steps that use dropout."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
from benchmarks import run
from benchmarks.workloads.spec import FRAMEWORKS, describe, expected_params, workloads

from bench_helpers import default_promotion

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


def _abstract_params(framework: str, w: Any) -> int:
    module = importlib.import_module(f"benchmarks.workloads.{_MODULE[framework]}")
    case = module.build(w)
    with default_promotion():
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
    "nnx_tree": "nnx_tree_models",
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
        with default_promotion():
            case = importlib.import_module(MODULES[fw]).build(w)
            # Shapes only: tracing reads no values, and an eager build compiles every initialiser.
            carry = tm.filter_eval_shape(lambda case=case: case.make_carry(case.make_model(0)))
            x, y = _batch(w, w.tiny_batch, case.channels_last)
            # Non-array leaves (activations, dropout rates) are static, as in the libraries' jit.
            text = str(tm.filter_make_jaxpr(case.step)(carry, x, y)[0])
        drawn = "random_bits" in text or "random_split" in text or "threefry" in text
        assert drawn == w.random, f"{fw}/{name}"


def _pure(tree: Any) -> Any:
    """NumPy copies of the arrays of `tree` (PRNG keys as their key data)."""

    def array(v: Any) -> np.ndarray:
        is_key = jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(v) if is_key else v)

    return jax.tree_util.tree_map(array, tree)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "transformer12"])
def test_nnx_tree_mode_computes_what_graph_mode_does(name: str) -> None:
    """The tree-mode contender is the NNX one with `nnx.set_graph_mode(False)`: from the same
    seed, three training steps give the same losses and leave the same model state (weights,
    BatchNorm statistics, dropout keys and counts), and the mode is restored after each call."""
    if run.unavailable("nnx"):
        pytest.skip(f"nnx: {run.unavailable('nnx')}")
    from flax import nnx

    from benchmarks.worker import _batch

    w = workloads(quick=True)[name]
    results = {}
    for fw in ("nnx", "nnx_tree"):
        with default_promotion():
            case = importlib.import_module(f"benchmarks.workloads.{_MODULE[fw]}").build(w)
            carry = case.make_carry(case.make_model(0))
            x, y = _batch(w, w.tiny_batch, case.channels_last)
            losses = []
            for _ in range(3):
                carry, loss = case.step(carry, x, y)
                losses.append(float(loss))
        assert nnx.set_graph_mode.current_value()  # graph mode again outside the calls
        results[fw] = losses, _pure(nnx.to_pure_dict(nnx.state(carry[0])))
    np.testing.assert_allclose(results["nnx_tree"][0], results["nnx"][0], rtol=1e-5)
    tree_state, graph_state = results["nnx_tree"][1], results["nnx"][1]
    assert jax.tree_util.tree_structure(tree_state) == jax.tree_util.tree_structure(graph_state)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        tree_state,
        graph_state,
    )


@pytest.mark.slow
@pytest.mark.heavy  # the suite's harness in fresh processes
def test_quick_run_with_flax_nnx_in_both_modes(tmp_path: Path) -> None:
    if run.unavailable("nnx"):
        pytest.skip(f"nnx: {run.unavailable('nnx')}")
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--frameworks", "nnx,nnx_tree"]
    cmd += ["--workloads", "transformer12", "--out", str(tmp_path), "--no-progress", "--jobs", "2"]
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}  # compiles faster
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    recs = {r["framework"]: r for r in data["records"]}
    assert set(recs) == {"nnx", "nnx_tree"}
    for fw, rec in recs.items():
        assert "error" not in rec, (fw, rec.get("traceback"))
        assert rec["params"] == expected_params(workloads(quick=True)["transformer12"])
        assert 0 < rec["step_tiny_s"] < rec["first_call_s"]
    assert recs["nnx_tree"]["first_loss"] == pytest.approx(recs["nnx"]["first_loss"], rel=1e-5)
    assert "| Flax NNX | Flax NNX (tree mode) |" in (tmp_path / "results.md").read_text()
