"""Helpers shared by the test files (on pytest's pythonpath, like `strategies.py`).

- `normal`: test inputs from NumPy's generator (`jax.random` compiles a program per new shape).
- `built`: a layer built under `filter_eval_shape` with normal values, for tests whose point does
  not depend on the random initialiser (which compiles once per new shape).
- `close`: two pytrees with the same structure and leaf shapes, equal within tolerances; leaves
  may be JAX or NumPy arrays, Python numbers or PyTorch tensors.
- `mypy_messages`, `snippet_line`: run mypy (through its API) on a user snippet and find the
  messages of the line that carries a `# marker` comment.
- `recursion_budget_lost`: levels of Python's recursion budget lost (see tests/conftest.py).
- `REFERENCES`, `missing_references`, `require_references`: the libraries the tests compare
  against, and the check that stops a CI run without one (tests/conftest.py runs it).
"""

from __future__ import annotations

import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "REFERENCES",
    "built",
    "close",
    "missing_references",
    "mypy_messages",
    "normal",
    "recursion_budget_lost",
    "require_references",
    "snippet_line",
    "to_numpy",
]


def normal(shape: tuple[int, ...], seed: int = 0, dtype: Any = jnp.float32) -> jax.Array:
    """Standard-normal test data of `shape` from NumPy's generator seeded with `seed`."""
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def built(make: Callable[[], Any], seed: int = 0) -> Any:
    """`make()`'s module, built under `tm.filter_eval_shape`, its float arrays drawn from `normal`.

    A layer's random initialiser compiles a program for each new shape (seconds for many shapes
    on a small CPU); this draws the same shapes and dtypes with NumPy instead."""
    import treemod as tm

    rng = np.random.default_rng(seed)

    def fill(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        assert jnp.issubdtype(leaf.dtype, jnp.floating), leaf
        return jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)

    return jax.tree.map(fill, tm.filter_eval_shape(make))


def to_numpy(x: Any) -> np.ndarray:
    """A JAX or NumPy array, Python number or PyTorch tensor as a NumPy array."""
    if hasattr(x, "detach"):  # a torch.Tensor (torch is not imported here)
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def close(
    ours: Any,
    theirs: Any,
    *,
    rtol: float = 1e-5,
    atol: float = 2e-5,
    check_dtype: bool = False,
    check_structure: bool = True,
) -> None:
    """Assert that two pytrees have equal leaf shapes and values (float32 tolerances by default).

    Arguments:
        ours, theirs: pytrees; leaves may be JAX or NumPy arrays, numbers or PyTorch tensors.
        rtol, atol: as in `np.testing.assert_allclose`.
        check_dtype: the leaves' dtypes must be equal too.
        check_structure: the tree structures must be equal (off: compare the leaves in order,
            for trees of two libraries' container types).
    """
    ours_leaves, ours_def = jax.tree_util.tree_flatten(ours)
    theirs_leaves, theirs_def = jax.tree_util.tree_flatten(theirs)
    if check_structure:
        assert ours_def == theirs_def, f"tree structures differ: {ours_def} vs {theirs_def}"
    for i, (a, b) in enumerate(zip(ours_leaves, theirs_leaves, strict=True)):
        a, b = to_numpy(a), to_numpy(b)
        assert a.shape == b.shape, f"leaf {i}: shape {a.shape} vs {b.shape}"
        if check_dtype:
            assert a.dtype == b.dtype, f"leaf {i}: dtype {a.dtype} vs {b.dtype}"
        if a.dtype.kind not in "biufc":  # bfloat16 and other ml_dtypes: compare as float64
            a, b = a.astype(np.float64), b.astype(np.float64)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"leaf {i}")


_MYPY_CACHE = Path(__file__).resolve().parents[1] / ".mypy_cache" / "typing-test"


def mypy_messages(tmp_path: Path, source: str) -> dict[int, str]:
    """mypy's messages about the snippet `source`, by line number (notes and errors joined).

    The package's analysis is cached in `.mypy_cache/typing-test`, so reruns are fast.
    """
    from mypy import api

    # A new module name each run: mypy would skip a module it finds fresh in its cache.
    path = tmp_path / f"user_code_{uuid.uuid4().hex}.py"
    path.write_text(textwrap.dedent(source))
    stdout, stderr, _ = api.run(
        [
            str(path),
            "--cache-dir",
            str(_MYPY_CACHE),
            "--no-error-summary",
            "--show-error-codes",
            "--follow-imports=silent",
            "--ignore-missing-imports",
        ]
    )
    assert not stderr, stderr
    found: dict[int, str] = {}
    for line in stdout.splitlines():
        match = re.match(rf"{re.escape(str(path))}:(\d+): (.*)", line)
        if match:
            n = int(match.group(1))
            found[n] = (found.get(n, "") + " " + match.group(2)).strip()
    return found


def snippet_line(source: str, marker: str) -> int:
    """The 1-based line of the snippet `source` that ends with `# marker`."""
    lines = textwrap.dedent(source).splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.endswith(f"# {marker}"))


def recursion_budget_lost() -> int:
    """Python's recursion limit minus the calling frame's depth minus the calls that still fit:
    levels of the budget lost to C code that entered a recursion and never left it."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back

    def fits(n: int) -> int:
        try:
            return fits(n + 1)
        except RecursionError:
            return n

    return sys.getrecursionlimit() - depth - fits(0)


# The libraries the tests compare against (import name: distribution).
REFERENCES = {
    "bitsandbytes": "bitsandbytes",
    "compressed_tensors": "compressed-tensors",
    "equinox": "equinox",
    "hypothesis": "hypothesis",
    "optax": "optax",
    "orbax.checkpoint": "orbax-checkpoint",
    "peft": "peft",
    "safetensors": "safetensors",
    "torch": "torch",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "treescope": "treescope",
}


def missing_references() -> list[str]:
    """The distributions of `REFERENCES` that cannot be found (without importing them)."""
    import importlib.util

    missing = []
    for module, distribution in REFERENCES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            missing.append(distribution)
    return missing


def require_references(environ: Mapping[str, str]) -> None:
    """Stop the run (`pytest.UsageError`) if `CI` is set in `environ` and a reference is missing."""
    import pytest

    if environ.get("CI") and (missing := missing_references()):
        raise pytest.UsageError(
            f"CI is set, and these reference libraries are not installed: {', '.join(missing)}. "
            "The tests compare against them; install the dev and torch extras "
            "(pip install -e '.[dev,torch]')."
        )
