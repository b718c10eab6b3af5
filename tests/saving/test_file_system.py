"""Saving to the file system: permissions kept, symbolic links written through, and the
temporaries of killed saves removed by a later save (only those)."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import treemod as tm
from treemod._saving import atomic_file

TREE = {"w": np.arange(6.0, dtype=np.float32), "step": 3}
LIKE = {"w": np.zeros(6, np.float32), "step": 0}

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and signals")


@posix_only
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_resaving_keeps_the_files_permissions(tmp_path: pathlib.Path, mode: int) -> None:
    path = tmp_path / "private.safetensors"
    tm.save(path, TREE)
    path.chmod(mode)
    tm.save(path, {"w": np.ones(6, np.float32), "step": 4})
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert tm.load(path, LIKE)["step"] == 4


@posix_only
def test_the_temporary_of_a_private_file_is_private(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "private.safetensors"
    tm.save(path, TREE)
    path.chmod(0o600)
    seen = []
    real_fchmod = os.fchmod

    def spy(fd: int, mode: int) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", spy)
    tm.save(path, TREE)
    assert seen == [0o600]  # created private, before a byte is written


@posix_only
def test_saving_to_a_symlink_writes_its_target(tmp_path: pathlib.Path) -> None:
    real_dir = tmp_path / "store"
    real_dir.mkdir()
    target = real_dir / "model.safetensors"
    tm.save(target, TREE)
    link = tmp_path / "latest.safetensors"
    link.symlink_to(os.path.relpath(target, tmp_path))
    tm.save(link, {"w": np.ones(6, np.float32), "step": 9})
    assert link.is_symlink() and os.readlink(link) == os.path.relpath(target, tmp_path)
    assert tm.load(target, LIKE)["step"] == 9
    assert sorted(os.listdir(real_dir)) == ["model.safetensors"]
    # A link to a file that does not exist yet creates it.
    dangling = tmp_path / "next.safetensors"
    dangling.symlink_to(real_dir / "new.safetensors")
    tm.save(dangling, TREE)
    assert dangling.is_symlink() and tm.load(real_dir / "new.safetensors", LIKE)["step"] == 3


def test_saving_to_a_directory_names_it(tmp_path: pathlib.Path) -> None:
    with pytest.raises(IsADirectoryError, match=f"cannot write '{tmp_path}': it is a directory"):
        tm.save(tmp_path, TREE)


_WRITER = """
import sys, numpy as np, treemod as tm
tm.save(sys.argv[1], {"w": [np.full(5_000_000, i, np.float32) for i in range(8)], "step": 2})
"""


def _killed_save(path: pathlib.Path) -> pathlib.Path:
    """Start a save of 160 MB in a subprocess and SIGKILL it mid-write; its temporary."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    before = set(path.parent.iterdir())
    for _attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], env=env)
        deadline = time.monotonic() + 600
        temps: list[pathlib.Path] = []
        while proc.poll() is None and time.monotonic() < deadline:
            temps = [
                p
                for p in set(path.parent.iterdir()) - before
                if p.name.startswith(f".{path.name}.tmp-")
            ]
            if temps and temps[0].stat().st_size > 1_000_000:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        proc.wait()
        if proc.returncode == -signal.SIGKILL:
            assert len(temps) == 1 and temps[0].exists()
            assert temps[0].name.startswith(f".{path.name}.tmp-{proc.pid}-")
            return temps[0]
    raise AssertionError("the writer finished every time before it could be killed")


@pytest.mark.heavy
@posix_only
def test_a_later_save_removes_the_temporaries_of_killed_saves_and_only_those(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "ckpt.safetensors"
    tm.save(path, TREE)
    stale = [_killed_save(path), _killed_save(path)]
    # Files that must survive: another checkpoint's temporary (its writer is dead too), a live
    # save's (this process), one of another machine, and look-alikes that are not temporaries.
    other = (
        tmp_path
        / f".other.safetensors.tmp-{stale[0].name.split('-')[1]}-{atomic_file._HOST}-{'0' * 12}"
    )
    live = tmp_path / atomic_file.temporary_name(path.name)
    remote = tmp_path / f".ckpt.safetensors.tmp-12345-{'f' * 8}-{'1' * 12}"
    lookalikes = [tmp_path / ".ckpt.safetensors.tmp-notes", tmp_path / "ckpt.safetensors.tmp-1-2-3"]
    for keep in (other, live, remote, *lookalikes):
        keep.write_bytes(b"x")
    tm.save(path, {"w": np.ones(6, np.float32), "step": 5})
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in (other, live, remote, *lookalikes))
    assert tm.load(path, LIKE)["step"] == 5
    # Untouched for longer than the bound, a temporary is stale whoever wrote it.
    old = time.time() - atomic_file.STALE_AFTER_S - 60
    os.utime(remote, (old, old))
    tm.save(path, TREE)
    assert not remote.exists() and live.exists()
