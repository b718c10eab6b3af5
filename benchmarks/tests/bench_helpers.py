"""Helpers shared by the benchmark harness's tests (this folder is on their import path)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def default_promotion() -> Iterator[None]:
    """JAX's default promotion rules: the peers' code (and the plain-JAX workloads) are not
    written for this test suite's strict settings."""
    with (
        warnings.catch_warnings(),
        jax.numpy_dtype_promotion("standard"),
        jax.numpy_rank_promotion("allow"),
    ):
        warnings.simplefilter("ignore")
        yield
