"""Test-wide settings and shared fixtures.

- JAX: strict dtype promotion, rank promotion raising, warnings as errors, eight fake CPU
  devices, float32 matmuls at the highest precision.
- Threads: one BLAS/OpenMP thread per process (`OMP_NUM_THREADS=1`, inherited by the xdist
  workers and the processes tests start). On a 2-core machine PyTorch's and NumPy's small
  matmuls ran 50-250x slower with two threads than with one, and `make test` runs two workers.
- Hypothesis: the `ci` profile (bounded examples, no deadline: the machines running the suite are
  small and shared) unless `HYPOTHESIS_PROFILE` names another (`thorough`: 10x the examples).
- Temporary files: `tempfile`'s directory is the test's `tmp_path` (also `TMPDIR` for the
  processes a test starts), so the docs pages' and doctests' `tempfile.mkdtemp()` leave nothing
  behind (pytest keeps the last three runs' directories).
- Fixtures: `shape_checks_on` (checks on with typeguard for one test, the previous global setting
  restored after it); `shape_checks_restored` (only the restoring).
- Markers (registered in pyproject.toml): `slow`, tests that compile several libraries' models;
  `heavy`, tests that start processes or tools (multi-process runs, mypy, mkdocs, examples,
  fresh interpreters, benchmark smoke runs). `make test` runs both; `make test-fast` neither.
- Workers: `make test` runs pytest-xdist with `--dist loadfile` (a file's tests on one worker,
  so a module-scoped fixture such as the API pages' mkdocs build or a multi-process run is
  computed once). `--dist loadgroup` is not used: xdist 3.8 marks a group by rewriting each
  test's node id, which pytest 9 no longer reads (pytest-xdist issue 1386), so groups were
  silently spread over the workers.
- Reference libraries: with the `CI` environment variable set (`.ci/run` sets it), a missing
  reference library (`REFERENCES` in helpers.py) stops the run before any test; elsewhere the
  tests that need one skip, so a contributor without PyTorch can still run the rest.
- JAX's persistent compilation cache: off in every test process. A test that turns it on
  (`tm.enable_compile_cache`, `jax_compilation_cache_dir`) in the worker itself must turn it off
  again (the `persistent_compile_cache` fixture does both); otherwise every later test in that
  worker writes its programs to the directory, and in CI one of them segfaulted inside XLA's
  `_compile_and_write_cache` and left the run hanging. After each test the settings are
  compared with those at the start; a test that left the cache on fails at teardown, naming
  the directory, and the settings are put back and JAX's cache handle reset.
- Hangs and crashes: pyproject's `faulthandler_timeout` (pytest's own) prints every thread's
  traceback and ends the process when one test runs for 15 minutes, and the Makefile's
  `--max-worker-restart=0` ends the run, naming the test, when a worker dies (segfault or
  timeout): pytest-xdist 3.8's `--dist loadfile` deadlocks after replacing a crashed worker
  (it requeues the dead worker's finished files as empty work; pytest-xdist issues 784, 1378).
- Recursion headroom: jaxlib's C++ tree flattening loses one level of Python's recursion budget
  per enclosing container whenever a flatten function or an `is_leaf` raises (jaxlib 0.10.2),
  and `sys.setrecursionlimit` does not give it back (it keeps the depth in use). treemod's own
  code never raises through a flattening (`tree_flatten_one_level` refuses after it), but tests
  of error paths and the references they compare with (Equinox's `tree_check` on a
  self-referencing tree) do, and in one worker the losses added up until unrelated later tests
  failed with `RecursionError`. After each test that lost budget, the limit is raised by as
  much.
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
# One BLAS/OpenMP thread (see above): a (3, 7, 32) x (32, 64) torch.nn.functional.linear took
# 2.6 ms with two threads, 0.01 ms with one. PyTorch reads this when it is first imported; NumPy's
# OpenBLAS, loaded by a plugin (jaxtyping's) before this file, is limited below.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from helpers import recursion_budget_lost, require_references  # noqa: E402  (tests/)

threadpool_limits(int(os.environ["OMP_NUM_THREADS"]))  # for the BLAS libraries loaded already
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
    # Every warning fails the test that raised it (a deprecation JAX, jaxtyping, optax or Orbax
    # raise from treemod's code among them), on both ends of the supported range.
    config.addinivalue_line("filterwarnings", "error")
    # treescope 0.1.10 reads every public name of NumPy when it first renders, `numpy.char`'s
    # `chararray` too, which NumPy 2.5 deprecates on access: not a call of treemod's.
    config.addinivalue_line(
        "filterwarnings", "ignore:The chararray class is deprecated:DeprecationWarning"
    )
    # Older transformers releases (the oldest end resolves one) decorate DeBERTa's helpers with
    # `torch.jit.script`, which torch 2.14 deprecates when the module is imported.
    config.addinivalue_line(
        "filterwarnings", "ignore:`torch.jit.script` is deprecated:FutureWarning"
    )
    require_references(os.environ)


# Levels lost before the first test ends, and levels given back since (the limit raised by).
_BUDGET = {"lost_at_start": -1, "given_back": 0}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    lost = recursion_budget_lost()
    if _BUDGET["lost_at_start"] < 0:
        _BUDGET["lost_at_start"] = lost
    # Raising the limit leaves the lost levels lost (it keeps the depth in use), so what was
    # given back already is counted apart.
    leaked = lost - _BUDGET["lost_at_start"] - _BUDGET["given_back"]
    if leaked > 0:
        sys.setrecursionlimit(sys.getrecursionlimit() + leaked)
        _BUDGET["given_back"] += leaked


_CACHE_SETTINGS = (
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)
# The settings the test processes start with (the cache directory unset unless the environment
# sets JAX_COMPILATION_CACHE_DIR), which every test must leave as it found them.
SESSION_CACHE_SETTINGS = {name: getattr(jax.config, name) for name in _CACHE_SETTINGS}


def restore_compile_cache_settings() -> str | None:
    """Put JAX's persistent-cache settings back as the session started, if a test changed them.

    Returns:
        None if the cache is not writing to a directory of the test's; else what was found,
        for the test's failure message (the settings are then restored and JAX's cache handle
        reset, so the next test starts clean).
    """
    from treemod._private_apis import reset_compilation_cache

    changed = {
        name: getattr(jax.config, name)
        for name, value in SESSION_CACHE_SETTINGS.items()
        if getattr(jax.config, name) != value
    }
    # Turned off (the benchmarks' worker does that in the process) writes nothing: left as is.
    writing = jax.config.jax_enable_compilation_cache and "jax_compilation_cache_dir" in changed
    if not writing:
        return None
    for name in changed:
        jax.config.update(name, SESSION_CACHE_SETTINGS[name])
    reset_compilation_cache()
    return (
        f"the test left JAX's persistent compilation cache settings changed ({changed}); "
        "every later test in this worker would write its programs there. Turn it on through "
        "the `persistent_compile_cache` fixture (tests/conftest.py), which turns it off after "
        "the test, or restore the settings and call "
        "treemod._private_apis.reset_compilation_cache() yourself."
    )


@pytest.fixture(autouse=True)
def compile_cache_left_off() -> Iterator[None]:
    """Fail, at teardown, a test that left JAX's persistent compilation cache on; turn it off."""
    yield
    if (problem := restore_compile_cache_settings()) is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture
def persistent_compile_cache(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """JAX's persistent compilation cache on in a fresh directory for one test, off after it."""
    import treemod as tm

    directory = tm.enable_compile_cache(tmp_path / "compile-cache")
    try:
        yield directory
    finally:
        restore_compile_cache_settings()


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
    """Restore treemod's global shape-check setting (`tm.shape_checks(...)`) after the test."""
    import treemod as tm
    from treemod._shapecheck.config import current

    saved = current()
    yield
    tm.shape_checks(*saved)


@pytest.fixture
def shape_checks_on(shape_checks_restored: None) -> None:
    """Shape checks on, with typeguard, for the test; the previous global setting after it."""
    import treemod as tm

    tm.shape_checks(True, checker="typeguard")
