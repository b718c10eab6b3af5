"""Saving to what is not a plain new file: special files, long names, read-only files, streams.

Only a regular file is ever replaced; a stream of any kind (append mode, compressing writers,
pipes) receives a complete checkpoint or nothing; a read-only file is refused as `open` refuses
it. Loading a special file is refused with the file's name instead of blocking or failing in a
seek.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import pathlib
import shutil
import stat
import struct
import tempfile
import threading

import jax
import numpy as np
import pytest

import treemod as tm
from treemod._saving.safetensors_write import canonical, header_digest

TREE = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(7)}


@pytest.mark.parametrize("through_link", [False, True])
def test_a_character_device_is_never_replaced(tmp_path, through_link):
    path = "/dev/null"
    if through_link:
        path = str(tmp_path / "ckpt")
        os.symlink("/dev/null", path)
    with pytest.raises(tm.CheckpointError, match=r"character device") as info:
        tm.save(path, TREE)
    assert repr(path)[1:-1] in str(info.value)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not [n for n in os.listdir(tmp_path) if n != "ckpt"], "a temporary was left behind"


@pytest.mark.parametrize("through_link", [False, True])
def test_a_fifo_is_never_replaced(tmp_path, through_link):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    path = fifo
    if through_link:
        path = tmp_path / "link"
        os.symlink(fifo, path)
    with pytest.raises(tm.CheckpointError, match=r"FIFO") as info:
        tm.save(path, TREE)
    assert str(path) in str(info.value)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == sorted({"pipe", path.name})


def test_loading_a_fifo_names_it_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(tm.CheckpointError, match=r"FIFO") as info:
        tm.load(fifo, TREE)
    assert str(fifo) in str(info.value)


@pytest.mark.parametrize("length", [235, 255])
def test_a_long_name_that_fits_the_file_system_can_be_saved(tmp_path, length):
    path = tmp_path / ("n" * length)
    tm.save(path, TREE)
    tm.save(path, TREE)  # replacing it works too
    np.testing.assert_array_equal(tm.load(path, TREE)["w"], TREE["w"])
    assert os.listdir(tmp_path) == [path.name]


def test_a_read_only_file_is_refused_for_a_user_who_may_not_write_it(tmp_path):
    """As a non-root user (root may write the file, with `open` too): the old file stays."""
    if os.geteuid() != 0:
        path = tmp_path / "best.ckpt"
        tm.save(path, TREE)
        before = path.read_bytes()
        os.chmod(path, 0o444)
        with pytest.raises(PermissionError, match="read-only") as info:
            tm.save(path, {"w": TREE["w"] + 1, "step": TREE["step"]})
        assert str(path) in str(info.value)
        assert path.read_bytes() == before
        return
    # As root, check it as the unprivileged user `nobody` (effective user id only, restored
    # at once), in a directory nobody can reach (pytest's tmp_path is private to root).
    nobody = 65534
    directory = tempfile.mkdtemp(prefix="treemod-readonly-", dir="/tmp")
    try:
        os.chmod(directory, 0o755)
        os.chown(directory, nobody, nobody)
        path = os.path.join(directory, "best.ckpt")
        tm.save(path, TREE)
        before = pathlib.Path(path).read_bytes()
        os.chown(path, nobody, nobody)
        os.chmod(path, 0o444)
        os.seteuid(nobody)
        try:
            with pytest.raises(PermissionError, match="read-only") as info:
                tm.save(path, {"w": TREE["w"] + 1, "step": TREE["step"]})
        finally:
            os.seteuid(0)
        assert path in str(info.value)
        assert pathlib.Path(path).read_bytes() == before
        assert os.listdir(directory) == ["best.ckpt"]
    finally:
        shutil.rmtree(directory)


def test_root_may_still_replace_a_read_only_file_as_open_does(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root may write a read-only file")  # the non-root case: above
    path = tmp_path / "f.ckpt"
    tm.save(path, TREE)
    os.chmod(path, 0o444)
    new = {"w": TREE["w"] + 1, "step": TREE["step"]}
    tm.save(path, new)
    np.testing.assert_array_equal(tm.load(path, TREE)["w"], new["w"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444


def test_several_checkpoints_appended_to_one_file_load_in_turn(tmp_path):
    path = tmp_path / "stream.bin"
    trees = [{"w": TREE["w"] + i, "step": np.int32(i)} for i in range(3)]
    for tree in trees:
        with open(path, "ab") as f:
            tm.save(f, tree)
    with open(path, "rb") as f:
        for tree in trees:
            got = tm.load(f, TREE)
            np.testing.assert_array_equal(got["w"], tree["w"])
            assert int(got["step"]) == int(tree["step"])
        assert f.read() == b""


@pytest.mark.parametrize("opener", [gzip.open, bz2.open, lzma.open], ids=["gzip", "bz2", "lzma"])
def test_compressing_writers_receive_a_whole_checkpoint(tmp_path, opener):
    path = tmp_path / "ckpt.z"
    with opener(path, "wb") as f:
        tm.save(f, TREE)
    with opener(path, "rb") as f:
        data = f.read()
    got = tm.load(io.BytesIO(data), TREE)
    np.testing.assert_array_equal(got["w"], TREE["w"])
    # The stream is a valid safetensors file that other readers accept.
    from safetensors.numpy import load

    assert set(load(data)) == {"['w']", "['step']"}


def test_a_pipe_receives_a_whole_checkpoint():
    read, write = os.pipe()
    received: list[bytes] = []

    def drain() -> None:
        with os.fdopen(read, "rb") as f:
            received.append(f.read())

    reader = threading.Thread(target=drain)
    reader.start()
    with os.fdopen(write, "wb") as f:
        tm.save(f, TREE)
    reader.join()
    np.testing.assert_array_equal(tm.load(io.BytesIO(received[0]), TREE)["w"], TREE["w"])


def test_a_failing_array_in_a_stream_writes_nothing():
    """Arrays are fetched and hashed before the first byte goes into a stream."""
    deleted = jax.numpy.ones(3)
    deleted.delete()

    class Sink(io.RawIOBase):  # a stream that cannot seek, as a socket or a pipe
        def __init__(self) -> None:
            self.received = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:  # type: ignore[override]
            self.received += bytes(b)
            return len(b)

    sink = Sink()
    with pytest.raises(RuntimeError, match=r"could not fetch the array at \['bad'\]"):
        tm.save(sink, {"good": np.ones(2, np.float32), "bad": deleted})
    assert sink.received == b""


def _edit_keys_record(data: bytes, edit) -> bytes:
    """Rewrite a checkpoint's key record and recompute its header checksum, as an editor can."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    meta = header["__metadata__"]
    keys = json.loads(meta["treemod.keys"])
    edit(keys)
    meta["treemod.keys"] = canonical(keys)
    table = {k: v for k, v in header.items() if k != "__metadata__"}
    meta["treemod.header_sha256"] = header_digest(table, meta)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + n :]


def test_a_key_record_that_disagrees_with_its_data_is_refused():
    buf = io.BytesIO()
    tm.save(buf, {"k": jax.random.key(0)})  # threefry keys

    def claim_rbg(keys):
        keys["['k']"]["dtype"] = "key<rbg>"

    edited = _edit_keys_record(buf.getvalue(), claim_rbg)
    like = {"k": jax.random.key(0, impl="rbg")}
    with pytest.raises(tm.CheckpointError, match=r"\['k'\].*key<rbg>") as info:
        tm.load(io.BytesIO(edited), like)
    assert "<BytesIO>" in str(info.value)
