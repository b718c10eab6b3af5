"""Test-wide settings and shared fixtures.

- JAX: strict dtype promotion, rank promotion raising, warnings as errors, eight fake CPU
  devices, float32 matmuls at the highest precision.
- Hypothesis: the `ci` profile (bounded examples, no deadline: the machines running the suite are
  small and shared) unless `HYPOTHESIS_PROFILE` names another (`thorough`: 10x the examples).
- Temporary files: `tempfile`'s directory is the test's `tmp_path` (also `TMPDIR` for the
  processes a test starts), so the docs pages' and doctests' `tempfile.mkdtemp()` leave nothing
  behind (pytest keeps the last three runs' directories).
- Fixtures: `shape_checks_on` (checks on with typeguard for one test, the previous global setting
  restored after it); `shape_checks_restored` (only the restoring).
- Markers (registered in pyproject.toml): `slow`, tests that compile several libraries' models;
  `make test` runs them.
- xdist groups: pytest-xdist (3.8) sends the tests of one `xdist_group` to one worker under
  `--dist loadgroup` by appending `@group` to each item's `_nodeid`, which pytest 9 no longer
  reads (the id lives in `_id`), so every group was silently spread over the workers (the API
  site built once per worker, the multi-process references computed twice). Where xdist's
  suffix did not take, `pytest_collection_modifyitems` sets it.
- Recursion headroom: jaxlib's C++ tree flattening loses one level of Python's recursion budget
  per enclosing container whenever a flatten function, `is_leaf` or a `tree_map` callback raises
  (jaxlib 0.10.2). Tests of error paths do that on purpose, and in one xdist worker the losses
  added up until unrelated later tests failed with `RecursionError`. After each test the budget
  lost is given back by raising the recursion limit.
"""

import os
import pathlib
import sys
import tempfile

# Optimisation level 0 of XLA's CPU backend (LLVM): the same operations in the same order, compiled
# several times faster. The suite mostly compiles small functions once and runs them once, so
# this is most of its time (an Equinox Conv3d's initialiser: 2.8 s -> 0.4 s).
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
# The references (PyTorch, NumPy) compute float32 matmuls exactly; on GPUs JAX's default
# precision lets them round inputs to TF32. Tests of treemod's own precision choices set theirs.
jax.config.update("jax_default_matmul_precision", "highest")

# Each example may compile: a deadline would fail a test on a busy machine, not a slow law.
settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "error")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test of an `xdist_group` the `@group` id suffix `--dist loadgroup` reads."""
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    from _pytest.nodeid import NodeId

    for item in items:
        if "@" in item.nodeid:
            continue
        names = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
        if names:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


def _recursion_budget_lost() -> int:
    """The recursion limit minus this frame's depth minus the calls that still fit."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back

    def fits(n: int) -> int:
        try:
            return fits(n + 1)
        except RecursionError:
            return n

    return sys.getrecursionlimit() - depth - fits(0)


_BUDGET_LOST_AT_START: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    lost = _recursion_budget_lost()
    if not _BUDGET_LOST_AT_START:
        _BUDGET_LOST_AT_START.append(lost)
    leaked = lost - _BUDGET_LOST_AT_START[0]
    if leaked > 0:
        sys.setrecursionlimit(sys.getrecursionlimit() + leaked)


@pytest.fixture(autouse=True)
def temporary_files_in_tmp_path(tmp_path: pathlib.Path) -> Iterator[None]:
    """`tempfile.mkdtemp()` and friends, here and in the processes the test starts: `tmp_path`.

    Restored by hand, not through `monkeypatch`: requesting it here would make every test's
    `monkeypatch` undo its patches only after the other fixtures' teardowns."""
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = str(tmp_path)
    yield
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]


@pytest.fixture
def shape_checks_restored() -> Iterator[None]:
    """Restore treemod's global shape-check setting (`tm.set_shape_checks`) after the test."""
    import treemod as tm
    from treemod._shapecheck.config import current

    saved = current()
    yield
    tm.set_shape_checks(*saved)


@pytest.fixture
def shape_checks_on(shape_checks_restored: None) -> None:
    """Shape checks on, with typeguard, for the test; the previous global setting after it."""
    import treemod as tm

    tm.set_shape_checks(True, checker="typeguard")
