"""`tests/resume.py`, the runner `make test` uses: after a worker crash it runs the crashed and
unfinished tests again, and only those; a test that crashes every time, or a plain failure,
fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # starts pytest with two workers, three times

RUNNER = Path(__file__).parents[1] / "resume.py"
CONFTEST = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from tests import resume
def pytest_collection_modifyitems(config, items):
    resume.deselect_finished(config, items)
def pytest_runtest_logreport(report):
    resume.record(report)
"""
# test_b of the last file kills its worker (once, or always), as a segfault would.
TESTS = """
import os, pathlib
def test_a(): pass
def test_c(): assert {fail} == 0
def test_b():
    marker = pathlib.Path(__file__).with_name("crashed")
    if {index} == 3 and ({always} or not marker.exists()):
        marker.touch()
        os.kill(os.getpid(), 11)
"""


def _run(tmp_path: Path, *, always: bool = False, fail: int = 0) -> tuple[int, str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for i in range(4):
        text = TESTS.format(index=i, always=always, fail=int(fail and i == 0))
        (tmp_path / f"test_f{i}.py").write_text(text)
    args = ["-n", "2", "--dist", "loadfile", "--max-worker-restart=0", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args, "-q", "-rA", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    return done.returncode, done.stdout


def test_a_crash_once_is_resumed_with_only_the_unfinished_tests(tmp_path: Path) -> None:
    code, out = _run(tmp_path)
    assert code == 0, out
    assert "resume.py: a worker crashed in ['test_f3.py::test_b'] (attempt 1)" in out
    second = out.split("(attempt 1)")[1]
    assert "PASSED test_f3.py::test_b" in second and "test_f0.py" not in second


def test_a_test_that_always_crashes_fails_the_run(tmp_path: Path) -> None:
    code, out = _run(tmp_path, always=True)
    assert code != 0
    assert "resume.py: crashed twice, so not a flaky crash: ['test_f3.py::test_b']" in out


def test_a_failure_fails_the_run_without_resuming(tmp_path: Path) -> None:
    code, out = _run(tmp_path, fail=1)
    assert code == 1
    assert "FAILED test_f0.py::test_c" in out and "resume.py" not in out
