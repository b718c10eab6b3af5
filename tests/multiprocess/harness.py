"""Run one Python function (or script) in N real JAX processes on this machine, and gather results.

Each process is a fresh interpreter with `--xla_force_host_platform_device_count=K` fake CPU
devices, multi-process collectives through gloo, and `jax.distributed.initialize` already called
with a free local port. The environment also looks like a SLURM job step (`SLURM_NTASKS`,
`SLURM_PROCID`, ...; `JAX_COORDINATOR_PORT`), so a script that calls
`jax.distributed.initialize()` without arguments finds its coordinator as it would on a cluster.

- `run_function("module:function", ...)`: the function (importable with `tests/` on the path) is
  called with the keyword arguments given; it returns a dict of arrays and scalars, which comes
  back as one dict of NumPy arrays per process (through an `.npz` file).
- `run_script(code, ...)`: runs source text as `__main__`, with `jax.distributed.initialize`
  left to the script (the docs page's blocks).

All processes share one new process group; when one fails (non-zero exit), or the time limit
passes, the whole group is killed at once (children the processes started included) and a
`ProcessesFailed` error shows every process's exit status, stdout and stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
# Environment variables of a real cluster that must not leak into the processes we launch.
_CLUSTER_VARIABLES = ("SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_", "JAX_COORDINATOR")


class ProcessesFailed(AssertionError):
    """Some process of a multi-process run failed or ran out of time; the message shows all."""


@dataclass
class Finished:
    """What one process left: its exit status, output and result."""

    process_id: int
    returncode: int | None  # None: killed because of another's failure or the time limit
    stdout: str
    stderr: str

    def printed(self) -> list[str]:
        """The lines the process printed, without gloo's connection log: gloo's C++ code writes
        it to the same stdout, whole, in pieces or with blank lines between Python's."""
        return [
            line
            for line in self.stdout.splitlines()
            if line.strip() and not line.startswith("[Gloo]") and "peer ranks" not in line
        ]


def free_port() -> int:
    """A TCP port that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _environment(num_processes: int, process_id: int, devices: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLUSTER_VARIABLES)}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")]),
        PYTHONUNBUFFERED="1",
        # One SLURM job step on this host: jax.distributed.initialize() detects it.
        SLURM_JOB_ID="1",
        SLURM_STEP_NODELIST="127.0.0.1",
        SLURM_STEP_NUM_NODES="1",
        SLURM_NTASKS=str(num_processes),
        SLURM_PROCID=str(process_id),
        SLURM_LOCALID=str(process_id),
        JAX_COORDINATOR_PORT=str(port),
        # Collectives across processes on CPU, and the suite's settings (tests/conftest.py).
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
        JAX_NUMPY_RANK_PROMOTION="raise",
        JAX_DEFAULT_MATMUL_PRECISION="highest",
    )
    return env


def _describe(finished: list[Finished], reason: str) -> str:
    parts = [reason]
    for f in finished:
        status = "killed" if f.returncode is None else f"exit status {f.returncode}"
        parts.append(f"===== process {f.process_id}: {status}")
        parts.append(f"----- stdout:\n{f.stdout.rstrip()}")
        parts.append(f"----- stderr:\n{f.stderr.rstrip()}")
    return "\n".join(parts)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# What the coordinator says when another program took its port between `free_port` and binding.
_PORT_TAKEN = ("Address already in use", "Failed to add port")


def _launch(
    argv_for: Any, num_processes: int, devices: int, timeout: float, workdir: Path
) -> list[Finished]:
    """`_launch_once`, again with a new port (twice at most) if the coordinator's was taken."""
    for attempt in range(3):
        try:
            return _launch_once(argv_for, num_processes, devices, timeout, workdir)
        except ProcessesFailed as e:
            if attempt == 2 or not any(s in str(e) for s in _PORT_TAKEN):
                raise
    raise AssertionError("unreachable")


def _launch_once(
    argv_for: Any, num_processes: int, devices: int, timeout: float, workdir: Path
) -> list[Finished]:
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    outputs = []
    pgid: int | None = None
    codes: list[int | None] = [None] * num_processes
    try:
        for i in range(num_processes):
            out = open(workdir / f"stdout-{i}.txt", "wb")  # noqa: SIM115 - closed below
            err = open(workdir / f"stderr-{i}.txt", "wb")  # noqa: SIM115
            outputs.append((out, err))
            group = {"process_group": 0 if pgid is None else pgid}
            proc = subprocess.Popen(
                argv_for(i, port),
                cwd=workdir,
                env=_environment(num_processes, i, devices, port),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                **group,  # type: ignore[call-overload]
            )
            if pgid is None:
                pgid = proc.pid
            procs.append(proc)
        deadline = time.monotonic() + timeout
        reason = None
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                reason = f"process {bad[0]} of {num_processes} failed"
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                waiting = [i for i, c in enumerate(codes) if c is None]
                reason = f"processes {waiting} still running after the time limit of {timeout:g} s"
                break
            time.sleep(0.05)
    finally:
        if pgid is not None:
            _kill_group(pgid)  # the group: the processes and anything they started
        for p in procs:
            p.wait()
        for out, err in outputs:
            out.close()
            err.close()
    finished = [
        Finished(
            i,
            codes[i],
            (workdir / f"stdout-{i}.txt").read_text(errors="replace"),
            (workdir / f"stderr-{i}.txt").read_text(errors="replace"),
        )
        for i in range(num_processes)
    ]
    if reason is not None:
        raise ProcessesFailed(_describe(finished, reason))
    return finished


def run_function(
    target: str,
    *,
    num_processes: int,
    devices_per_process: int,
    timeout: float = 180.0,
    workdir: Path | None = None,
    **kwargs: Any,
) -> list[dict[str, np.ndarray]]:
    """Call `target` ("module:function") in `num_processes` JAX processes; their results, in order.

    Arguments:
        target: the function, as `"module:function"` importable with `tests/` on the path.
        num_processes: how many processes to launch.
        devices_per_process: fake CPU devices in each.
        timeout: seconds the whole run may take (all processes start together).
        workdir: where the processes run and leave their files (a new temporary folder,
            removed after, if not given).
        kwargs: JSON-serialisable keyword arguments for the function.

    Returns:
        One dict of NumPy arrays per process: what its function returned.

    Raises:
        ProcessesFailed: a process failed or the time limit passed (every process's output
            in the message).
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tm-mp-")))
        arguments = json.dumps(kwargs)

        def argv_for(i: int, port: int) -> list[str]:
            result = str(workdir / f"result-{i}.npz")
            return [sys.executable, __file__, "function", target, arguments, result]

        finished = _launch(argv_for, num_processes, devices_per_process, timeout, workdir)
        results = []
        for i in range(num_processes):
            if not (workdir / f"result-{i}.npz").exists():
                reason = f"process {i} of {num_processes} exited (status 0) without a result"
                raise ProcessesFailed(_describe(finished, reason))
            with np.load(workdir / f"result-{i}.npz") as data:
                results.append({k: data[k] for k in data.files})
        return results


def run_script(
    code: str, *, num_processes: int, devices_per_process: int, timeout: float = 180.0
) -> list[Finished]:
    """Run Python source `code` as `__main__` in `num_processes` processes; what each printed.

    The script calls `jax.distributed.initialize()` itself (the SLURM-like environment gives it
    the coordinator); gloo collectives are already switched on.

    Raises:
        ProcessesFailed: a process failed or the time limit passed.
    """
    with tempfile.TemporaryDirectory(prefix="tm-mp-") as tmp:
        workdir = Path(tmp)
        (workdir / "script.py").write_text(code)

        def argv_for(i: int, port: int) -> list[str]:
            return [sys.executable, __file__, "script", str(workdir / "script.py")]

        return _launch(argv_for, num_processes, devices_per_process, timeout, workdir)


def _main(argv: list[str]) -> None:
    import runpy
    import warnings

    warnings.simplefilter("error")
    mode = argv[0]
    if mode == "script":
        runpy.run_path(argv[1], run_name="__main__")
        return
    _, target, arguments, result = argv
    import jax

    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{os.environ['JAX_COORDINATOR_PORT']}",
        num_processes=int(os.environ["SLURM_NTASKS"]),
        process_id=int(os.environ["SLURM_PROCID"]),
    )
    import importlib

    module, name = target.split(":")
    out = getattr(importlib.import_module(module), name)(**json.loads(arguments))
    partial = f"{result}.partial.npz"  # renamed once complete: never read half-written
    np.savez(partial, **{k: np.asarray(v) for k, v in out.items()})
    os.replace(partial, result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    _main(sys.argv[1:])
