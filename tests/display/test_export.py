"""`jax.export` of a treemod model's call, run in a fresh process that never imports treemod.

The reference is the model's own call in this process and, for the MLP, NumPy arithmetic on its
weights; the exported program runs where only jax (no treemod) is importable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import treemod as tm
import treemod.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_cnn import CNN  # noqa: E402

# Runs the serialised program; treemod is unreachable (`-I` and a path without the repository).
RUNNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from jax import export
    exported = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    x = np.load(sys.argv[2])
    np.save(sys.argv[3], np.asarray(exported.call(x)))
    assert "treemod" not in sys.modules, "the exported program imported treemod"
    print("ok", [str(s.shape) for s in exported.in_avals])
    """
)


def _run_fresh(tmp_path: Path, blob: bytes, x: np.ndarray) -> np.ndarray:
    (tmp_path / "model.jaxexport").write_bytes(blob)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "runner.py").write_text(RUNNER)
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            str(tmp_path / "runner.py"),
            str(tmp_path / "model.jaxexport"),
            str(tmp_path / "x.npy"),
            str(tmp_path / "y.npy"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok"), out.stdout
    return np.load(tmp_path / "y.npy")


@pytest.mark.heavy
def test_mlp_exported_with_symbolic_batch_runs_without_treemod(tmp_path: Path) -> None:
    mlp = nn.MLP(4, 2, 8, 1, key=jax.random.key(0))
    (batch,) = export.symbolic_shape("batch")
    exported = export.export(jax.jit(lambda x: jax.vmap(mlp)(x)))(
        jax.ShapeDtypeStruct((batch, 4), jnp.float32)
    )
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    got = _run_fresh(tmp_path, exported.serialize(), x)
    w0, b0 = np.asarray(mlp.layers[0].weight), np.asarray(mlp.layers[0].bias)
    w1, b1 = np.asarray(mlp.layers[1].weight), np.asarray(mlp.layers[1].bias)
    want = np.maximum(x @ w0.T + b0, 0) @ w1.T + b1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Another batch size through the same file: the batch dimension is symbolic.
    got7 = _run_fresh(tmp_path, exported.serialize(), np.ones((7, 4), np.float32))
    assert got7.shape == (7, 2)


@pytest.mark.heavy
def test_digits_cnn_in_inference_mode_exports_and_matches(tmp_path: Path) -> None:
    model = tm.nn.inference_mode(CNN(key=jax.random.key(0), width=8))
    (batch,) = export.symbolic_shape("batch")
    exported = export.export(jax.jit(lambda x: model(x)))(
        jax.ShapeDtypeStruct((batch, 1, 8, 8), jnp.float32)
    )
    x = np.random.default_rng(1).normal(size=(3, 1, 8, 8)).astype(np.float32)
    got = _run_fresh(tmp_path, exported.serialize(), x)
    np.testing.assert_allclose(got, np.asarray(model(jnp.asarray(x))), rtol=1e-5, atol=1e-5)
