"""Reading Equinox's format: values that would change on the way in, and special files.

Files are written by real Equinox. Equinox reads a scalar record into `like`'s leaf with
`type(leaf)(value)`, so a float `0.001` becomes the int `0` and an int `5` the bool `True`;
treemod's reader refuses such a record naming the key path, as `tm.load` refuses the mismatch.
"""

from __future__ import annotations

import io
import os
import pathlib
import threading
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as ceqx

# One value of each Python scalar type Equinox writes, and the record kind it reads from.
VALUES: dict[type, Any] = {bool: True, int: 5, float: 0.001, complex: 1.5 - 2j}


def _eqx_bytes(tree: Any) -> bytes:
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, tree)
    return buf.getvalue()


@pytest.mark.parametrize("saved", list(VALUES), ids=lambda t: t.__name__)
@pytest.mark.parametrize("like", list(VALUES), ids=lambda t: t.__name__)
def test_a_scalar_loads_only_into_its_own_kind(saved: type, like: type) -> None:
    data = _eqx_bytes({"hyper": [VALUES[saved]]})
    target = {"hyper": [like()]}
    if saved is like:
        assert ceqx.tree_deserialise_leaves(io.BytesIO(data), target) == {"hyper": [VALUES[saved]]}
        return
    with pytest.raises(tm.CheckpointError) as e:
        ceqx.tree_deserialise_leaves(io.BytesIO(data), target)
    message = str(e.value)
    assert "at ['hyper'][0]" in message
    found = np.asarray(VALUES[saved]).dtype
    assert f"changed type from {like.__name__} in `like` to {found} " in message
    assert "would change the value" in message


def test_the_two_truncations_of_the_issue_name_the_key_path() -> None:
    # What Equinox itself does with these files: the silent truncation being refused.
    assert eqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes({"n": 0.001})), {"n": 0}) == {"n": 0}
    assert eqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes({"b": 5})), {"b": False}) == {
        "b": True
    }
    with pytest.raises(tm.CheckpointError, match=r"float64 0\.001 on disk: .* at \['n'\]"):
        ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes({"n": 0.001})), {"n": 0})
    with pytest.raises(RuntimeError, match=r"from bool in `like` to int64 5 on disk: .*\['b'\]"):
        ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes({"b": 5})), {"b": False})


def test_numpy_scalars_need_their_own_dtype() -> None:
    data = _eqx_bytes([np.float64(0.25), np.int32(7)])
    assert ceqx.tree_deserialise_leaves(io.BytesIO(data), [np.float64(0), np.int32(0)]) == [
        np.float64(0.25),
        np.int32(7),
    ]
    with pytest.raises(tm.CheckpointError, match=r"from float16 in `like` to float64 0\.25.*\[0\]"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), [np.float16(0), np.int32(0)])
    with pytest.raises(tm.CheckpointError, match=r"from int64 in `like` to int32 7 on disk.*\[1\]"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), [np.float64(0), np.int64(0)])


def test_arrays_and_wider_integers_still_load() -> None:
    # An int record of any width reads into a Python int; arrays are checked by dtype as before.
    data = _eqx_bytes({"step": np.uint8(200).item(), "w": jnp.arange(3.0)})
    out = ceqx.tree_deserialise_leaves(io.BytesIO(data), {"step": 0, "w": jnp.zeros(3)})
    assert out["step"] == 200 and type(out["step"]) is int
    np.testing.assert_array_equal(np.asarray(out["w"]), [0.0, 1.0, 2.0])


def _load_without_blocking(path: pathlib.Path) -> BaseException | None:
    """Load `path` in a thread; fail (after unblocking it) if the load waits for a writer."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            ceqx.tree_deserialise_leaves(path, {"w": jnp.zeros(2)})
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # releases a blocked open
        thread.join(timeout=20)
        pytest.fail(f"tree_deserialise_leaves blocked on {path}, waiting for a writer")
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX feature")
def test_a_fifo_is_refused_naming_the_file(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "model.eqx"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path / "model"):  # the suffix added, as Equinox adds it
        error = _load_without_blocking(path)
        assert isinstance(error, tm.CheckpointError), error
        assert f"{fifo} is a FIFO (named pipe), not a regular file" in str(error)
        assert "io.BytesIO(open(path, 'rb').read())" in str(error)
    link = tmp_path / "link.eqx"
    link.symlink_to(fifo)
    error = _load_without_blocking(link)
    assert isinstance(error, tm.CheckpointError) and "link.eqx is a FIFO" in str(error)


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_character_device_is_refused_naming_the_file(tmp_path: pathlib.Path) -> None:
    link = tmp_path / "null.eqx"
    link.symlink_to("/dev/null")
    error = _load_without_blocking(link)
    assert isinstance(error, tm.CheckpointError), error
    assert "null.eqx is a character device, not a regular file" in str(error)


def test_regular_files_and_directories_are_read_as_before(tmp_path: pathlib.Path) -> None:
    eqx.tree_serialise_leaves(tmp_path / "model", {"w": jnp.ones(2)})
    assert _load_without_blocking(tmp_path / "model") is None
    (tmp_path / "dir.eqx").mkdir()
    error = _load_without_blocking(tmp_path / "dir.eqx")
    assert isinstance(error, tm.CheckpointError) and "dir.eqx is a directory" in str(error)
