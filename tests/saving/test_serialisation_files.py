"""Checkpoint files: corruption and truncation, pickles, atomic saves under SIGKILL, interop."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import pickle
import signal
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm

TREE = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(2, jnp.int32), "step": 3}


def _like():
    return {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2, jnp.int32), "step": 0}


def _raw(tree=TREE) -> bytes:
    buf = io.BytesIO()
    tm.save(buf, tree)
    return buf.getvalue()


def _split(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _load_bytes(tmp_path: pathlib.Path, raw: bytes, like=None, **kwargs):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    return tm.load(path, _like() if like is None else like, **kwargs)


def _error(tmp_path: pathlib.Path, raw: bytes, **kwargs) -> str:
    with pytest.raises(tm.CheckpointError) as e:
        _load_bytes(tmp_path, raw, **kwargs)
    msg = str(e.value)
    assert "bad.safetensors" in msg  # every file error names the file
    return msg


def _rehash(header: dict) -> dict:
    """Recompute the header checksum, as a forger (or a buggy writer) would."""
    from treemod._saving.safetensors_write import header_digest

    table = {k: v for k, v in header.items() if k != "__metadata__"}
    header["__metadata__"]["treemod.header_sha256"] = header_digest(table, header["__metadata__"])
    return header


def test_valid_file_loads(tmp_path: pathlib.Path) -> None:
    out = _load_bytes(tmp_path, _raw())
    np.testing.assert_array_equal(np.asarray(out["w"]), np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("keep", [0, 5, 8, 30, -1, -13])
def test_truncated_files(tmp_path: pathlib.Path, keep: int) -> None:
    raw = _raw()
    msg = _error(tmp_path, raw[:keep])
    assert "truncated" in msg or "too short" in msg


def test_appended_bytes(tmp_path: pathlib.Path) -> None:
    assert "bytes were appended" in _error(tmp_path, _raw() + b"extra")


def test_flipped_data_byte_fails_the_checksum(tmp_path: pathlib.Path) -> None:
    raw = bytearray(_raw())
    raw[-3] ^= 0x10
    msg = _error(tmp_path, bytes(raw))
    assert "corrupted: the checksum of tensor" in msg and "does not match its data" in msg


def test_flipped_shape_digit_fails_the_header_checksum(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["['w']"]["shape"] = [3, 2]  # same byte count, so only the checksum can tell
    assert "header checksum does not match" in _error(tmp_path, _join(header, data))


def test_changed_saved_value_fails_the_header_checksum(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["__metadata__"]["treemod.values"] = json.dumps({"['step']": ["int", "4"]})
    assert "header checksum does not match" in _error(tmp_path, _join(header, data))


def test_bad_json_header(tmp_path: pathlib.Path) -> None:
    raw = bytearray(_raw())
    raw[8] = ord("[")
    assert "header is not valid JSON" in _error(tmp_path, bytes(raw))
    header_list = b"[1, 2]"
    assert "not a JSON object" in _error(
        tmp_path, struct.pack("<Q", len(header_list)) + header_list
    )


def test_bad_header_length(tmp_path: pathlib.Path) -> None:
    raw = struct.pack("<Q", 10**12) + _raw()[8:]
    msg = _error(tmp_path, raw)
    assert "header is 1000000000000 bytes long" in msg and "truncated or is not a checkpoint" in msg


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("dtype", "F99", "unknown dtype 'F99'"),
        ("shape", [2, -3], "invalid shape"),
        ("shape", "23", "invalid shape"),
        ("data_offsets", [8, 0], "without gaps or overlaps"),
        ("data_offsets", [0], "invalid data_offsets"),
        ("data_offsets", [0, 7], "takes 24 bytes"),
        ("data_offsets", [10**6, 10**6 + 24], "without gaps or overlaps"),
    ],
)
def test_bad_tensor_entries(tmp_path: pathlib.Path, field: str, value, expected: str) -> None:
    header, data = _split(_raw())
    header["['w']"][field] = value
    msg = _error(tmp_path, _join(_rehash(header), data))
    assert expected in msg


def test_entry_that_is_not_an_object_and_bad_metadata(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["['w']"] = 5
    assert "is not an object" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["x"] = 1
    assert "'__metadata__' must map strings to strings" in _error(tmp_path, _join(header, data))


def test_malformed_treemod_metadata(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["__metadata__"]["treemod.values"] = "{not json"
    assert "'treemod.values' is not valid JSON" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["treemod.values"] = json.dumps({"['step']": ["int", [1]]})
    assert "saved value at \"['step']\" is malformed" in _error(
        tmp_path, _join(_rehash(header), data)
    )
    header, data = _split(_raw())
    header["__metadata__"]["treemod.dtypes"] = json.dumps({"['w']": "object"})
    assert "unknown dtype 'object'" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["treemod.dtypes"] = json.dumps({"['w']": "int4"})
    assert "cannot hold int4 data" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    del header["__metadata__"]["treemod.sha256"]
    assert "lacks 'treemod.sha256'" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["treemod.sha256"] = json.dumps({})
    assert "tensor \"['b']\" has no checksum" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["treemod.sha256"] = "[]"
    assert "'treemod.sha256' is not an object" in _error(tmp_path, _join(_rehash(header), data))


def test_versions(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["__metadata__"]["treemod.version"] = "2"
    msg = _error(tmp_path, _join(_rehash(header), data))
    assert "format version 2, newer than this treemod reads" in msg and "Upgrade" in msg
    header["__metadata__"]["treemod.version"] = "one"
    assert "format version 'one' is not a number" in _error(tmp_path, _join(header, data))


def test_not_a_treemod_checkpoint(tmp_path: pathlib.Path) -> None:
    assert "first 8 bytes say" in _error(tmp_path, b"hello, this is a text file\n")
    zipped = b"PK\x03\x04" + b"\0" * 100
    assert "zip archive (a PyTorch" in _error(tmp_path, zipped)
    npy = io.BytesIO()
    np.save(npy, np.ones(3))
    assert "treemod.compat.equinox.tree_deserialise_leaves" in _error(tmp_path, npy.getvalue())
    # A plain safetensors file without treemod's metadata.
    header, data = _split(_raw())
    del header["__metadata__"]
    msg = _error(tmp_path, _join(header, data))
    assert "not a treemod checkpoint" in msg and "allow_foreign=True" in msg


class _Payload:
    """Unpickling this creates a marker file: proof that code from the file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_pickle_payload_is_rejected_without_running(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"w": _Payload(str(marker))}, protocol=4)
    # The payload is live: unpickling it does create the marker.
    pickle.loads(pickle.dumps(_Payload(str(tmp_path / "control"))))
    assert (tmp_path / "control").exists()
    msg = _error(tmp_path, payload)
    assert "Python pickle" in msg and "never unpickles" in msg
    assert not marker.exists()
    # A pickle hidden as a tensor's bytes is only ever bytes.
    buf = io.BytesIO()
    tm.save(buf, {"p": np.frombuffer(payload, np.uint8)})
    buf.seek(0)
    out = tm.load(buf, {"p": np.zeros(len(payload), np.uint8)})
    assert out["p"].tobytes() == payload and not marker.exists()


# --- interoperability ----------------------------------------------------------------------


def test_files_load_with_safetensors_numpy(tmp_path: pathlib.Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "m.safetensors"
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3, dtype=np.int64)}
    tree["c"] = np.array([1 + 2j], np.complex64)
    tree["flag"] = np.array([True, False])
    tm.save(path, {"layers": [tree], "step": 4})
    out = safetensors_numpy.load_file(str(path))
    assert set(out) == {f"['layers'][0]['{k}']" for k in tree}
    for k, v in tree.items():
        np.testing.assert_array_equal(out[f"['layers'][0]['{k}']"], v)


def test_files_load_into_pytorch(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import ml_dtypes

    path = tmp_path / "m.safetensors"
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    tree = {
        "bf16": jnp.asarray(x, jnp.bfloat16),
        "f8": jnp.asarray(x, jnp.float8_e4m3fn),
        "int4": np.array([-8, 7, 0], ml_dtypes.int4),
        "c128": np.array([1 + 2j, -3j]),
    }
    tm.save(path, tree)
    out = safetensors_torch.load_file(str(path))
    assert out["['bf16']"].dtype == torch.bfloat16
    np.testing.assert_array_equal(
        out["['bf16']"].float().numpy(), np.asarray(tree["bf16"], np.float32)
    )
    assert out["['f8']"].dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(out["['f8']"].float().numpy(), np.asarray(tree["f8"], np.float32))
    # Non-standard dtypes arrive as their raw storage: int4 as one byte each, complex128 as pairs.
    assert out["['int4']"].dtype == torch.uint8
    np.testing.assert_array_equal(out["['int4']"].numpy().view(ml_dtypes.int4), tree["int4"])
    np.testing.assert_array_equal(torch.view_as_complex(out["['c128']"]).numpy(), tree["c128"])


def _torch_name(key_path: str) -> str:
    """treemod key path -> PyTorch state_dict name: '.layers[0].weight' -> 'layers.0.weight'."""
    return key_path.replace("[", ".").replace("]", "").replace("'", "").lstrip(".")


class Linear(tm.Module):
    weight: jax.Array
    bias: jax.Array


class MLP(tm.Module):
    layers: list


def test_weights_move_between_treemod_and_pytorch(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    net = (
        torch.nn.Module()
    )  # state_dict names: layers.0.weight, layers.0.bias, layers.2.weight, ...
    net.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    # PyTorch -> treemod: rename, save with safetensors, load with the usual checks.
    like = MLP(
        [Linear(jnp.zeros((8, 4)), jnp.zeros(8)), None, Linear(jnp.zeros((2, 8)), jnp.zeros(2))]
    )
    key_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(like)[0]]
    by_torch_name = {_torch_name(k): k for k in key_paths}
    state = {by_torch_name[n]: t for n, t in net.state_dict().items()}
    safetensors_torch.save_file(state, str(tmp_path / "from_torch.safetensors"))
    model = tm.load(tmp_path / "from_torch.safetensors", like, allow_foreign=True)

    def forward(m: MLP, x: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ m.layers[0].weight.T + m.layers[0].bias[None])
        return h @ m.layers[2].weight.T + m.layers[2].bias[None]

    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected = net.layers(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(
        np.asarray(forward(model, jnp.asarray(x))), expected, rtol=1e-5, atol=1e-6
    )

    # treemod -> PyTorch: save, load with safetensors.torch, rename.
    model = jax.tree_util.tree_map(lambda w: w * 2.0, model)
    tm.save(tmp_path / "to_torch.safetensors", model)
    loaded = safetensors_torch.load_file(str(tmp_path / "to_torch.safetensors"))
    net.load_state_dict({_torch_name(k): v for k, v in loaded.items()})
    np.testing.assert_allclose(
        np.asarray(forward(model, jnp.asarray(x))),
        net.layers(torch.from_numpy(x)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_checksums_are_sha256_of_each_tensor(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    digests = json.loads(header["__metadata__"]["treemod.sha256"])
    for name, digest in digests.items():
        begin, end = header[name]["data_offsets"]
        assert hashlib.sha256(data[begin:end]).hexdigest() == digest


def test_saving_keeps_normal_permissions(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.safetensors"
    tm.save(path, TREE)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.safetensors"
    tm.save(path, TREE)

    class Boom:
        shape = (2,)
        dtype = np.dtype(np.float32)

        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("device lost")

    from treemod._saving.safetensors_write import write_checkpoint

    with pytest.raises(RuntimeError, match="device lost"):
        write_checkpoint(path, [("x", Boom())], {})
    assert os.listdir(tmp_path) == ["c.safetensors"]
    assert tm.load(path, _like())["step"] == 3


_WRITER = """
import sys, numpy as np, treemod as tm
n = int(sys.argv[2])
tm.save(sys.argv[1], {"w": [np.full(n // 8, i, np.float32) for i in range(8)], "step": 2})
"""


@pytest.mark.heavy
def test_sigkill_during_save_leaves_the_old_checkpoint_intact(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    old = {"w": [np.full(1000, i, np.float32) for i in range(8)], "step": 1}
    tm.save(path, old)
    old_bytes = path.read_bytes()
    n = 40_000_000  # 160 MB of float32: a write that takes a while
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for _attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n)], env=env)
        killed_mid_write = False
        deadline = time.monotonic() + 600  # generous: the machine may be busy
        while proc.poll() is None and time.monotonic() < deadline:
            temps = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
            if temps and temps[0].stat().st_size > 1_000_000:
                proc.send_signal(signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.001)
        proc.wait()
        if killed_mid_write:
            break
    assert killed_mid_write, "the writer finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL
    # The half-written temporary is left beside the checkpoint, which is untouched.
    temps = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(temps) == 1 and temps[0].name.startswith(".ckpt.safetensors.tmp-")
    assert 1_000_000 < temps[0].stat().st_size < n * 4
    assert path.read_bytes() == old_bytes
    like = {"w": [jax.ShapeDtypeStruct((1000,), jnp.float32)] * 8, "step": 0}
    loaded = tm.load(path, like)
    assert loaded["step"] == 1
    for i, w in enumerate(loaded["w"]):
        np.testing.assert_array_equal(np.asarray(w), old["w"][i])
    with pytest.raises(tm.CheckpointError, match="truncated"):
        tm.load(temps[0], like)


def test_hostile_headers_get_checkpoint_errors(tmp_path: pathlib.Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert "nested more than 127 levels" in _error(tmp_path, struct.pack("<Q", len(deep)) + deep)
    header, data = _split(_raw())
    header["__metadata__"]["treemod.values"] = "[" * 100_000 + "]" * 100_000
    assert "'treemod.values' is not valid JSON" in _error(tmp_path, _join(_rehash(header), data))
    header, data = _split(_raw())
    header["__metadata__"]["treemod.version"] = "²"
    assert "is not a number" in _error(tmp_path, _join(_rehash(header), data))
    for bad in (["complex", {"a": 1}], ["complex", ["1"]], ["int", "9" * 5000], ["set", "x"]):
        header, data = _split(_raw())
        header["__metadata__"]["treemod.values"] = json.dumps({"['step']": bad})
        assert "is malformed" in _error(tmp_path, _join(_rehash(header), data))


def test_unknown_prng_implementation(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw({"k": jax.random.key(0)}))
    header["__metadata__"]["treemod.keys"] = json.dumps(
        {"['k']": {"dtype": "key<fry>", "impl": "bogus"}}
    )
    msg = _error(tmp_path, _join(_rehash(header), data), like={"k": jax.random.key(1)})
    assert "PRNG keys at ['k'] (implementation 'bogus') cannot be rebuilt" in msg
