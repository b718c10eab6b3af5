"""Run a snippet in a fresh Python interpreter and return what it printed.

For programs that trace `jax.debug.breakpoint`: at trace time it captures the tracing process's
stack frames, and inside a pytest-xdist worker that breaks the sending of the test's report
(a RecursionError in execnet's serialiser ends the whole run with INTERNALERROR).
"""

from __future__ import annotations

import subprocess
import sys


def run_printing(code: str) -> str:
    """Run `code` with this interpreter in a new process; fail with its stderr if it fails."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout
