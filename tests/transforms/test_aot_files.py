"""save_compiled writes its file as `tm.save` does: in one rename after an fsync, an existing
file's permissions kept, symbolic links written through, and the temporaries of killed saves
removed by a later save (only those)."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as ceqx
from treemod._saving import atomic_file

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and signals")


def _save(path: pathlib.Path, n: int) -> None:
    """Save a step compiled for the static factor `n`."""
    tm.save_compiled(path, tm.filter_jit(lambda x, k: x * k).lower(jnp.ones(3), n))


def _saved_factor(path: pathlib.Path, n: int) -> None:
    """The file at `path` is the step for `n` (a step for another factor refuses `n`)."""
    out = tm.load_compiled(path)(jnp.arange(3.0), n)
    np.testing.assert_array_equal(out, np.arange(3.0) * n)


@posix_only
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_resaving_keeps_the_files_permissions(tmp_path: pathlib.Path, mode: int) -> None:
    path = tmp_path / "step.jaxexe"
    _save(path, 2)
    path.chmod(mode)
    _save(path, 3)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    _saved_factor(path, 3)


@posix_only
def test_a_new_file_gets_the_umasks_permissions(tmp_path: pathlib.Path) -> None:
    old = os.umask(0o022)
    try:
        _save(tmp_path / "step.jaxexe", 2)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "step.jaxexe").stat().st_mode) == 0o644  # not 0600


@posix_only
def test_saving_to_a_symlink_writes_its_target(tmp_path: pathlib.Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    target = store / "step.jaxexe"
    _save(target, 2)
    link = tmp_path / "latest.jaxexe"
    link.symlink_to(os.path.relpath(target, tmp_path))
    _save(link, 5)
    assert link.is_symlink() and os.readlink(link) == os.path.relpath(target, tmp_path)
    _saved_factor(target, 5)
    assert sorted(os.listdir(store)) == ["step.jaxexe"]


def test_errors_name_save_compiled_and_the_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(IsADirectoryError, match=f"save_compiled: cannot write '{tmp_path}'"):
        _save(tmp_path, 2)
    missing = tmp_path / "no" / "step.jaxexe"
    with pytest.raises(FileNotFoundError, match=f"save_compiled: cannot write '{missing}'"):
        _save(missing, 2)


# A save stopped (SIGKILL) after its temporary is written, before the rename.
_KILLED = """
import os, sys, time
import jax.numpy as jnp, treemod as tm
def stall(fd):
    print("written", flush=True)
    time.sleep(600)
os.fsync = stall
tm.save_compiled(sys.argv[1], tm.filter_jit(lambda x: x * 2).lower(jnp.ones(3)))
"""


def _killed_save(path: pathlib.Path) -> pathlib.Path:
    before = set(path.parent.iterdir())
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(path)], env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "written\n"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    temps = [p for p in set(path.parent.iterdir()) - before]
    assert len(temps) == 1 and temps[0].name.startswith(f".{path.name}.tmp-{proc.pid}-")
    return temps[0]


@pytest.mark.heavy
@posix_only
def test_a_later_save_removes_the_temporaries_of_killed_saves_and_only_those(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "step.jaxexe"
    stale = _killed_save(path)
    live = tmp_path / atomic_file.temporary_name(path.name)  # this process: a save under way
    dead_pid = stale.name.split("-")[1]  # another file's temporary, of the same killed process
    other = tmp_path / f".other.jaxexe.tmp-{dead_pid}-{atomic_file._HOST}-{'0' * 12}"
    lookalike = tmp_path / ".step.jaxexe.tmp-notes"
    for keep in (live, other, lookalike):
        keep.write_bytes(b"x")
    _save(path, 4)
    assert not stale.exists()
    assert live.exists() and other.exists() and lookalike.exists()
    _saved_factor(path, 4)


def test_the_equinox_format_names_its_writer_too(tmp_path: pathlib.Path) -> None:
    # the same writer serves tree_serialise_leaves: its errors name that function, not `save`
    missing = tmp_path / "no" / "model.eqx"
    with pytest.raises(FileNotFoundError, match=f"tree_serialise_leaves: cannot write '{missing}'"):
        ceqx.tree_serialise_leaves(missing, {"w": np.zeros(2, np.float32)})
