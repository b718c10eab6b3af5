"""Fixtures for the multi-process tests: `launch` runs a function in N JAX processes.

The processes are real interpreters talking through `jax.distributed` (gloo collectives on CPU);
see harness.py. Each test module starts its runs once (module-scoped fixtures) and its tests
read the results, so the whole folder launches a handful of runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multiprocess import harness

# What the processes run, not tests: not collected (--doctest-modules would import them, and
# checkpointing.py needs the optional orbax-checkpoint).
collect_ignore = [
    "harness.py",
    "training.py",
    "checkpointing.py",
    "probes.py",
    "pretrained.py",
    "sharded.py",
]

# Generous: two processes compile on two shared cores. A crashed process fails the run at once.
TIMEOUT = 300.0

Launch = Callable[..., list[dict[str, np.ndarray]]]


@pytest.fixture(scope="session")
def launch() -> Launch:
    """`launch(target, processes, devices, **kwargs)`: run `target` in that many processes."""

    def run(
        target: str, processes: int, devices: int, workdir: Path | None = None, **kwargs: Any
    ) -> list[dict[str, np.ndarray]]:
        return harness.run_function(
            target,
            num_processes=processes,
            devices_per_process=devices,
            timeout=TIMEOUT,
            workdir=workdir,
            **kwargs,
        )

    return run
