"""Run pytest, and resume the run where it stopped when a worker process crashed.

jaxlib 0.12.0.1 segfaults now and then inside XLA's compiler (always the same instruction of
`libjax_common.so`, in different tests, at any load). With `--max-worker-restart=0` (the
Makefile: pytest-xdist 3.8's loadfile scheduler hangs when it replaces a crashed worker) such a
crash ends the run with the test named and the rest not run. This runner starts pytest again
for the tests that did not finish, the crashed one included, up to `RESUMES` times. A test that
crashes twice, or any failure, fails the run: a deterministic crash in treemod's code still
fails, and nothing that finished is run again.

The root `conftest.py` calls `record` for every report (in the controlling process) and
`deselect_finished` at collection, through two environment variables this runner sets.

    python tests/resume.py <pytest arguments>
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESUMES = 3
OUTCOMES = "TREEMOD_PYTEST_OUTCOMES"  # where each finished test's outcome is appended
FINISHED = "TREEMOD_PYTEST_FINISHED"  # the tests an earlier attempt finished (deselected)
CRASH = "crashed while running"  # pytest-xdist's report of a test whose worker died


def record(report: Any) -> None:
    """Append `report`'s test and outcome to the outcomes file, in the controlling process
    (pytest-xdist's workers, which set `PYTEST_XDIST_WORKER`, report to it)."""
    path = os.environ.get(OUTCOMES)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if CRASH in str(report.longrepr or ""):
        outcome = "crashed"
    elif report.when == "call" or report.outcome != "passed":
        outcome = report.outcome  # a call's outcome; a skip or error in set-up or teardown
    else:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{outcome}\t{report.nodeid}\n")


def deselect_finished(config: Any, items: list[Any]) -> None:
    """Deselect the tests an earlier attempt finished (the same in every worker)."""
    path = os.environ.get(FINISHED)
    if not path:
        return
    finished = set(Path(path).read_text(encoding="utf-8").splitlines())
    done = [item for item in items if item.nodeid in finished]
    if done:
        config.hook.pytest_deselected(items=done)
        items[:] = [item for item in items if item.nodeid not in finished]


def _outcomes(path: Path) -> dict[str, str]:
    """Each test's last outcome (a crashed test's teardown report comes after its crash)."""
    found: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            outcome, nodeid = line.split("\t", 1)
            if found.get(nodeid) not in ("crashed", "failed"):
                found[nodeid] = outcome
    return found


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="treemod-resume-") as tmp:
        outcomes, finished = Path(tmp, "outcomes.tsv"), Path(tmp, "finished.txt")
        # A fresh start, also when this runs inside another run's worker (tests/project).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PYTEST_XDIST_") and k != FINISHED
        }
        env[OUTCOMES] = str(outcomes)
        crashed_before: set[str] = set()
        for attempt in range(RESUMES + 1):
            code = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
            found = _outcomes(outcomes)
            crashed = {nodeid for nodeid, o in found.items() if o == "crashed"}
            failed = sorted(nodeid for nodeid, o in found.items() if o == "failed")
            if code == 0 or failed or not crashed:
                return code
            if twice := crashed & crashed_before:
                print(f"resume.py: crashed twice, so not a flaky crash: {sorted(twice)}")
                return code
            if attempt == RESUMES:
                break
            crashed_before |= crashed
            print(
                f"resume.py: a worker crashed in {sorted(crashed)} (attempt {attempt + 1}); "
                f"running the {len(crashed)} crashed and the unfinished tests again"
            )
            kept = [f"{o}\t{n}\n" for n, o in found.items() if o != "crashed"]
            outcomes.write_text("".join(kept), encoding="utf-8")
            finished.write_text("\n".join(n for n, o in found.items() if o != "crashed"))
            env[FINISHED] = str(finished)
        print(f"resume.py: workers crashed {RESUMES + 1} times; giving up")
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
