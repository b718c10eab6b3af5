"""The harness itself: results come back per process, failures show every process's output and
stop the run at once, time limits kill the whole process group, nothing is left running."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from multiprocess import harness

# One xdist worker runs them all (`make test`: -n 2 --dist loadgroup), so each run starts once.
pytestmark = pytest.mark.heavy  # processes talking through jax.distributed


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, only not yet reaped by init


def _none_alive(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _pids_script(folder: Path, then: str) -> str:
    """Each process starts a long `sleep` child, records both pids, then runs `then`."""
    return textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen(["sleep", "600"])
        rank = os.environ["SLURM_PROCID"]
        with open(os.path.join({str(folder)!r}, "pids-" + rank), "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        print("process", rank, "started its child", flush=True)
        """
    ) + textwrap.dedent(then)


def _recorded_pids(folder: Path) -> list[int]:
    return [int(p) for f in sorted(folder.glob("pids-*")) for p in f.read_text().split()]


def test_scripts_run_in_every_process_and_print() -> None:
    code = (
        "import os\n"
        "print('hello from', os.environ['SLURM_PROCID'], 'of', os.environ['SLURM_NTASKS'])"
    )
    finished = harness.run_script(code, num_processes=2, devices_per_process=1, timeout=120)
    assert [f.stdout.strip() for f in finished] == ["hello from 0 of 2", "hello from 1 of 2"]
    assert all(f.returncode == 0 for f in finished)


def test_a_crash_fails_fast_shows_everyone_and_leaves_no_strays(tmp_path: Path) -> None:
    # Process 1 crashes; process 0 would wait for ten minutes: the run must end at once.
    then = """
        if rank == "1":
            # Fail only once process 0 is up: its output must be in the report too.
            while not os.path.exists(os.path.join(os.path.dirname(f.name), "pids-0")):
                time.sleep(0.05)
            time.sleep(0.5)
            print("process 1 about to fail", file=sys.stderr)
            raise ValueError("boom in process 1")
        time.sleep(600)
        """
    with pytest.raises(harness.ProcessesFailed) as info:
        harness.run_script(
            _pids_script(tmp_path, then), num_processes=2, devices_per_process=1, timeout=300
        )
    message = str(info.value)
    # Ended by the failure, not by the 300 s limit (whose reason says "after the time limit").
    assert "process 1 of 2 failed" in message
    assert "time limit" not in message
    assert "===== process 0: killed" in message
    assert "===== process 1: exit status 1" in message
    assert "ValueError: boom in process 1" in message
    assert "process 1 about to fail" in message
    assert "process 0 started its child" in message  # the survivor's stdout too
    pids = _recorded_pids(tmp_path)
    assert len(pids) == 4
    assert _none_alive(pids), "processes (or their children) left running"


def test_a_time_limit_kills_the_whole_group(tmp_path: Path) -> None:
    then = """
        time.sleep(600)
        """
    with pytest.raises(harness.ProcessesFailed) as info:
        harness.run_script(
            _pids_script(tmp_path, then), num_processes=2, devices_per_process=1, timeout=15
        )
    assert "processes [0, 1] still running after the time limit of 15 s" in str(info.value)
    pids = _recorded_pids(tmp_path)
    assert len(pids) == 4
    assert _none_alive(pids), "processes (or their children) left running"


def test_free_ports_are_bindable() -> None:
    import socket

    port = harness.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_a_taken_coordinator_port_is_retried_with_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]]  # the first run's port is in use by someone else
        real = harness.free_port

        def port() -> int:
            ports.append(real())
            return ports[-2] if len(ports) == 2 else ports[-1]

        monkeypatch.setattr(harness, "free_port", port)
        code = "import jax\njax.distributed.initialize()\nprint(jax.process_count())"
        finished = harness.run_script(code, num_processes=2, devices_per_process=1, timeout=120)
    assert len(ports) >= 3  # a second port was asked for
    assert [f.stdout.splitlines()[-1] for f in finished] == ["2", "2"]


def test_a_process_that_leaves_without_its_result_fails_the_run() -> None:
    with pytest.raises(harness.ProcessesFailed) as info:
        harness.run_function(
            "multiprocess.probes:exit_without_result", num_processes=1, devices_per_process=1
        )
    message = str(info.value)
    assert "process 0 of 1 exited (status 0) without a result" in message
    assert "leaving early" in message
