"""Test-wide JAX settings: strict promotion, warnings as errors, eight fake CPU devices."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
# The references (PyTorch, NumPy) compute float32 matmuls exactly; on GPUs JAX's default
# precision lets them round inputs to TF32. Tests of treemod's own precision choices set theirs.
jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "error")
