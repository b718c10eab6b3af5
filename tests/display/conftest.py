"""The `onnx` fixture of the ONNX tests (test_onnx.py, test_onnx_zoo.py): jax2onnx's `to_onnx`,
onnxruntime, and the export-write-run-compare steps they share.

jax2onnx is imported by the fixture, never at collection, so the oldest end (which deselects
`slow` tests and has no jax2onnx) still collects those files; a missing one fails in CI (as a
missing reference library does) and skips elsewhere."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np
import pytest


def _allow_jax2onnx_on_this_jax() -> None:
    """JAX 0.12 folded `ClosedJaxpr` into `Jaxpr` and dropped the old name from `jax._src.core`;
    jax2onnx 0.17.1 (its `jit` lowering) still reads it there. `jax.extend.core.ClosedJaxpr` is
    JAX's public alias of the class, so the name is put back as that alias."""
    import jax._src.core as jax_core
    import jax.extend.core

    if not hasattr(jax_core, "ClosedJaxpr"):
        jax_core.ClosedJaxpr = jax.extend.core.ClosedJaxpr  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def onnx() -> SimpleNamespace:
    """`to_onnx` and onnxruntime; a missing one is an error in CI and a skip elsewhere."""
    try:
        import onnxruntime
        from jax2onnx import to_onnx
    except ImportError as e:
        message = (
            f"{e.name} is not installed: the ONNX tests need jax2onnx and onnxruntime "
            "(make's .venv/.dev step, or pip install -e '.[onnx]' && pip install --no-deps "
            "jax2onnx==0.17.1)."
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    _allow_jax2onnx_on_this_jax()
    tools = SimpleNamespace(to_onnx=to_onnx, ort=onnxruntime)
    tools.run_exported = lambda *args: _run_exported(tools, *args)
    tools.assert_equals_jitted = _assert_equals_jitted
    return tools


def _run_exported(
    onnx: SimpleNamespace, tmp_path: Path, fn: Callable[[Any], Any], spec: Any, xs: list[Any]
) -> tuple[list[Any], list[np.ndarray]]:
    """Export `fn` for `spec` to a file, open it in onnxruntime, and run it on each of `xs`."""
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx.to_onnx(fn, [spec]).SerializeToString())
    options = onnx.ort.SessionOptions()
    options.log_severity_level = 3  # errors only: unused-initialiser notes are not failures
    session = onnx.ort.InferenceSession(str(path), options)
    (graph_input,) = session.get_inputs()
    outputs = [session.run(None, {graph_input.name: x})[0] for x in xs]
    return graph_input.shape, outputs


def _assert_equals_jitted(fn: Callable[[Any], Any], xs: list[Any], got: list[np.ndarray]) -> None:
    jitted = jax.jit(fn)
    for x, y in zip(xs, got, strict=True):
        want = np.asarray(jitted(x))
        assert y.shape == want.shape, (x.shape, y.shape, want.shape)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
