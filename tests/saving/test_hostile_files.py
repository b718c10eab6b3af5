"""Hostile and damaged checkpoint files, and leaves that checkpoints cannot hold as they are.

Every failure to read a file is a `CheckpointError` that names the file and what is wrong; a
file with any treemod metadata is a damaged treemod checkpoint (its checksums stay verified,
even with allow_foreign=True); simple-value subclasses (IntEnum, ...) round-trip or are refused
by key path, never silently dropped.
"""

from __future__ import annotations

import decimal
import enum
import fractions
import io
import json
import os
import pathlib
import struct
import threading

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from saving.test_serialisation_files import TREE, _like, _raw, _split

import treemod as tm
import treemod.compat.equinox as ceqx
from treemod._saving import safetensors_header

LIKE = _like()


def _with_header(text: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text + data


def _error(tmp_path: pathlib.Path, raw: bytes, like=LIKE, **kwargs) -> str:
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(raw)
    with pytest.raises(tm.CheckpointError) as e:
        tm.load(path, like, **kwargs)
    assert "hostile.safetensors" in str(e.value)  # every error names the file
    return str(e.value)


def test_header_dtype_that_is_a_list(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    header["['w']"]["dtype"] = ["F32"]
    msg = _error(tmp_path, _with_header(json.dumps(header).encode(), data))
    assert "tensor \"['w']\" has an unknown dtype ['F32']" in msg


def test_header_with_a_5000_digit_integer(tmp_path: pathlib.Path) -> None:
    header, data = _split(_raw())
    text = (
        json.dumps(header)
        .encode()
        .replace(b'"shape": [2, 3]', b'"shape": [2, ' + b"9" * 5000 + b"]")
    )
    msg = _error(tmp_path, _with_header(text, data))
    assert "out of the float64 range" in msg
    text = (
        json.dumps(header)
        .encode()
        .replace(b'"shape": [2, 3]', b'"shape": [2, ' + b"9" * 300 + b"]")
    )
    assert "tensor \"['w']\" has an invalid shape" in _error(tmp_path, _with_header(text, data))


def test_text_mode_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "text.safetensors"
    tm.save(path, TREE)
    with open(path, encoding="latin-1") as f, pytest.raises(tm.CheckpointError) as e:
        tm.load(f, LIKE)
    assert "text.safetensors" in str(e.value) and "text mode" in str(e.value)
    assert "'rb'" in str(e.value)


def test_directory(tmp_path: pathlib.Path) -> None:
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(tm.CheckpointError, match="'.*ckpt' is a directory, not a checkpoint file"):
        tm.load(tmp_path / "ckpt", LIKE)


def test_missing_file_is_both_errors(tmp_path: pathlib.Path) -> None:
    for kind in (tm.CheckpointError, FileNotFoundError):
        with pytest.raises(kind, match="no checkpoint file '.*nope.safetensors'"):
            tm.load(tmp_path / "nope.safetensors", LIKE)


@pytest.mark.skipif(not hasattr(os, "pipe"), reason="no pipes on this platform")
def test_pipes_are_read_front_to_back() -> None:
    raw = _raw() + _raw({"w": jnp.ones((2, 3)), "b": jnp.zeros(2, jnp.int32), "step": 7})
    r, w = os.pipe()

    def feed() -> None:
        with os.fdopen(w, "wb") as f:
            for i in range(0, len(raw), 100):  # in pieces, as a pipe delivers them
                f.write(raw[i : i + 100])
                f.flush()

    thread = threading.Thread(target=feed)
    thread.start()
    with os.fdopen(r, "rb") as f:
        first = tm.load(f, LIKE)
        second = tm.load(f, LIKE)
    thread.join()
    np.testing.assert_array_equal(np.asarray(first["w"]), np.arange(6.0).reshape(2, 3))
    assert first["step"] == 3 and second["step"] == 7
    np.testing.assert_array_equal(np.asarray(second["w"]), np.ones((2, 3)))


@pytest.mark.skipif(not hasattr(os, "pipe"), reason="no pipes on this platform")
def test_truncated_pipe() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as f:
        f.write(_raw()[:-5])
    with os.fdopen(r, "rb") as f, pytest.raises(tm.CheckpointError, match="truncated: its tensors"):
        tm.load(f, LIKE)


def test_every_truncation_is_a_checkpoint_error(tmp_path: pathlib.Path) -> None:
    raw = _raw()
    for keep in range(len(raw)):
        msg = _error(tmp_path, raw[:keep])
        assert any(w in msg for w in ("truncated", "too short", "not a treemod checkpoint")), msg


def test_header_too_large_for_safetensors(tmp_path: pathlib.Path) -> None:
    raw = struct.pack("<Q", 100_000_001) + b"{" + b" " * 100
    msg = _error(tmp_path, raw)
    assert "header is 100000001 bytes long" in msg
    stream = io.BytesIO(raw)
    stream.seekable = lambda: False  # type: ignore[method-assign]
    with pytest.raises(tm.CheckpointError, match="more than the 100,000,000 bytes safetensors"):
        tm.load(stream, LIKE)


def test_too_many_entries_are_refused_while_parsing(tmp_path: pathlib.Path) -> None:
    n = safetensors_header.MAX_TENSORS + 1
    entries = ",".join(
        f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(n)
    )
    raw = _with_header(("{" + entries + "}").encode(), b"\0" * n)
    msg = _error(tmp_path, raw, allow_foreign=True)
    assert "more than 100,000 entries" in msg and "fewer large ones" in msg


def test_saving_too_many_arrays_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from treemod._saving import safetensors_write

    monkeypatch.setattr(safetensors_write, "MAX_TENSORS", 3)
    with pytest.raises(ValueError, match="the tree has 4 arrays, more than the 3"):
        tm.save(io.BytesIO(), [jnp.zeros(1)] * 4)


def test_a_flipped_format_marker_is_damage_not_a_foreign_file(tmp_path: pathlib.Path) -> None:
    raw = _raw()
    at = raw.index(b'"treemod.format"') + 10
    damaged = raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]
    for allow_foreign in (False, True):
        msg = _error(tmp_path, damaged, allow_foreign=allow_foreign)
        assert "damaged treemod checkpoint" in msg and "allow_foreign" not in msg
    at = raw.index(b'"treemod"', raw.index(b'"treemod.format"') + 16) + 3
    damaged = raw[:at] + bytes([raw[at] ^ 4]) + raw[at + 1 :]
    assert "format marker 'treemod.format' is 'traemod'" in _error(
        tmp_path, damaged, allow_foreign=True
    )


def test_every_bit_flip_in_the_header_is_caught_even_with_allow_foreign(
    tmp_path: pathlib.Path,
) -> None:
    raw = _raw({"w": jnp.arange(3.0), "n": 1})
    like = {"w": jnp.zeros(3), "n": 0}
    (n,) = struct.unpack("<Q", raw[:8])
    for at in range(8 + n):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[at] ^= 1 << bit
            try:
                out = tm.load(io.BytesIO(bytes(flipped)), like, allow_foreign=True)
            except tm.CheckpointError:
                continue
            # A flip that still loads must give back exactly what was saved.
            assert out["n"] == 1, (at, bit)
            np.testing.assert_array_equal(np.asarray(out["w"]), np.arange(3.0))


def test_a_foreign_file_is_still_told_to_use_allow_foreign(tmp_path: pathlib.Path) -> None:
    buf = safetensors.numpy.save({"['w']": np.ones(2, np.float32)}, metadata={"format": "np"})
    msg = _error(tmp_path, buf, like={"w": jnp.zeros(2)})
    assert "not a treemod checkpoint" in msg and "allow_foreign=True" in msg


def test_safetensors_dtypes_treemod_does_not_read(tmp_path: pathlib.Path) -> None:
    text = b'{"x": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}'
    msg = _error(tmp_path, _with_header(text, b"\0"), like={"x": jnp.zeros(2)}, allow_foreign=True)
    assert "tensor 'x' has dtype F4" in msg and "does not read" in msg


class Colour(enum.IntEnum):
    RED = 1
    GREEN = 2


class Mode(enum.StrEnum):
    TRAIN = "train"
    EVAL = "eval"


class Metres(float):
    pass


class Flag(enum.IntFlag):
    A = 1
    B = 2


def test_subclasses_of_simple_values_round_trip() -> None:
    tree = {"c": Colour.GREEN, "m": Mode.EVAL, "d": Metres(2.5), "f": Flag.A | Flag.B, "i": 4}
    like = {"c": Colour.RED, "m": Mode.TRAIN, "d": Metres(0.0), "f": Flag.A, "i": 0}
    buf = io.BytesIO()
    tm.save(buf, tree)
    buf.seek(0)
    out = tm.load(buf, like)
    assert out == tree and all(type(out[k]) is type(tree[k]) for k in tree)
    # The file holds plain values: a plain `like` (or another reader) gets plain values.
    buf.seek(0)
    plain = tm.load(buf, {"c": 0, "m": "", "d": 0.0, "f": 0, "i": 0})
    assert plain == {"c": 2, "m": "eval", "d": 2.5, "f": 3, "i": 4}
    assert [type(plain[k]) for k in "cmdfi"] == [int, str, float, int, int]
    # ... and a plain saved value loads into an enum field.
    buf = io.BytesIO()
    tm.save(buf, {"c": 1})
    buf.seek(0)
    assert tm.load(buf, {"c": Colour.GREEN})["c"] is Colour.RED


def test_a_value_that_is_not_a_member_is_refused_by_key_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "enum.safetensors"
    tm.save(path, {"c": 7})
    with pytest.raises(
        tm.CheckpointError,
        match=r"enum.safetensors.*the value 7 at \['c'\] cannot be made a Colour",
    ):
        tm.load(path, {"c": Colour.RED})
    with pytest.raises(
        tm.CheckpointError,
        match=r"wrong type: \['c'\] is an int value in the file but a Mode value",
    ):
        tm.load(path, {"c": Mode.TRAIN})


def test_lone_surrogates_and_huge_ints_are_refused_by_key_path() -> None:
    with pytest.raises(
        ValueError, match=r"the str value at \"\['s'\]\" holds a lone surrogate \('\\ud800'\)"
    ):
        tm.save(io.BytesIO(), {"s": "ab\ud800"})
    with pytest.raises(ValueError, match=r"the int at \['n'\] has about 5000 digits"):
        tm.save(io.BytesIO(), {"n": 10**5000})
    big = 10**4000  # below Python's limit: saved faithfully
    buf = io.BytesIO()
    tm.save(buf, {"n": big, "s": "é\U0001f600"})
    buf.seek(0)
    assert tm.load(buf, {"n": 0, "s": ""}) == {"n": big, "s": "é\U0001f600"}


def test_header_too_large_to_save_is_refused() -> None:
    with pytest.raises(ValueError, match="header would be .* bytes, more than the 100,000,000"):
        tm.save(io.BytesIO(), {"s": "x" * 100_000_001})


def test_closed_and_write_only_files_name_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    tm.save(path, TREE)
    f = open(path, "rb")
    f.close()
    for read in (
        lambda src: tm.load(src, LIKE),
        lambda src: ceqx.tree_deserialise_leaves(src, LIKE),
    ):
        with pytest.raises(
            tm.CheckpointError, match=r"model.safetensors' is closed|model.safetensors is closed"
        ):
            read(f)
        with (
            open(tmp_path / "out.bin", "wb") as w,
            pytest.raises(
                tm.CheckpointError, match="out.bin.? is not open for reading; open it with open"
            ),
        ):
            read(w)
    with pytest.raises(TypeError, match=r"got bytes \(checkpoint bytes in memory: .*io.BytesIO"):
        tm.load(path.read_bytes(), LIKE)


def test_the_equinox_format_reader_names_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.eqx"
    ceqx.tree_serialise_leaves(path, TREE)
    (tmp_path / "dir.eqx").mkdir()
    with pytest.raises(tm.CheckpointError, match=r"dir.eqx is a directory, not a file"):
        ceqx.tree_deserialise_leaves(tmp_path / "dir.eqx", LIKE)
    for kind in (tm.CheckpointError, FileNotFoundError):  # FileNotFoundError, as Equinox
        with pytest.raises(kind, match=r"there is no file .*nope.eqx"):
            ceqx.tree_deserialise_leaves(tmp_path / "nope", LIKE)
    with (
        open(path, encoding="latin-1") as f,
        pytest.raises(tm.CheckpointError, match=r"model.eqx is opened in text mode.*'rb'"),
    ):
        ceqx.tree_deserialise_leaves(f, LIKE)
    if hasattr(os, "pipe"):  # a pipe cannot seek, which NumPy's .npy reader needs: say so
        r, w = os.pipe()
        os.write(w, path.read_bytes())
        os.close(w)
        with (
            os.fdopen(r, "rb") as f,
            pytest.raises(
                tm.CheckpointError, match=r"cannot seek \(a pipe.*io.BytesIO\(f.read\(\)\)"
            ),
        ):
            ceqx.tree_deserialise_leaves(f, LIKE)
        with io.BytesIO(path.read_bytes()) as f:  # ... and the suggested fix works
            out = ceqx.tree_deserialise_leaves(f, LIKE)
        np.testing.assert_array_equal(np.asarray(out["w"]), np.asarray(TREE["w"]))


def test_a_shape_of_more_dimensions_than_an_array_can_have(tmp_path: pathlib.Path) -> None:
    for ndim, refused in ((safetensors_header.MAX_NDIM, False), (65, True), (3_000_000, True)):
        text = json.dumps({"x": {"dtype": "U8", "shape": [1] * ndim, "data_offsets": [0, 1]}})
        raw = _with_header(text.encode(), b"\0")
        if refused:
            msg = _error(tmp_path, raw, like={"x": np.zeros(1, np.uint8)}, allow_foreign=True)
            assert f"tensor 'x' has a shape of {ndim:,} dimensions, more than an array" in msg
        else:  # NumPy's most: read as the reference reads it
            assert safetensors_header.parse_header(raw[8:-1])[2]["x"].shape == (1,) * ndim


@pytest.mark.parametrize(
    "value",
    [b"1", b"[]", b'"a"'],
    ids=["numbers", "empty lists", "strings"],
)
def test_hostile_values_in_ignored_fields_are_checked_without_per_value_python_work(
    value: bytes,
) -> None:
    # A field the reference ignores may hold millions of values; each is checked (numbers
    # within float64, no lone surrogate, depth) by C-level scanning, so that the cost stays
    # that of parsing the JSON itself (once ~30 s for 30M numbers, against ~3 s for
    # json.loads). Work is counted, not timed: Python-level calls made while parsing must not
    # grow with the number of values (at most one call per 100 extra values).
    import sys

    def python_calls(count: int) -> int:
        extra = b",".join([value] * count)
        text = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[' + extra + b"]}}"
        calls = 0

        def profile(frame: object, event: str, arg: object) -> None:
            nonlocal calls
            if event == "call":
                calls += 1

        sys.setprofile(profile)
        try:
            safetensors_header.parse_header(text)
        finally:
            sys.setprofile(None)
        return calls

    small, large = 1_000, 200_000
    assert python_calls(large) - python_calls(small) <= (large - small) // 100
    bad = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":["\\ud800",' + value + b"]}}"
    with pytest.raises(safetensors_header.HeaderError, match="lone surrogate"):
        safetensors_header.parse_header(bad)


@pytest.mark.parametrize(
    "leaf",
    [fractions.Fraction(1, 3), decimal.Decimal("1.5"), b"raw"],
    ids=["Fraction", "Decimal", "bytes"],
)
def test_data_leaves_checkpoints_cannot_hold_are_refused_by_key_path(leaf: object) -> None:
    # Saved as nothing, they would load as like's value without a word: refused instead.
    buf = io.BytesIO()
    with pytest.raises(
        TypeError, match=rf"save: the leaf at \['opt'\]\[1\] is a {type(leaf).__name__},"
    ):
        tm.save(buf, {"w": jnp.ones(2), "opt": [1, leaf]})
    assert buf.getvalue() == b""  # nothing written


def test_saving_to_a_file_that_cannot_take_a_checkpoint_names_it(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.safetensors"
    tm.save(path, TREE)
    for write in (tm.save, ceqx.tree_serialise_leaves):
        with (
            open(tmp_path / "notes.txt", "w") as f,
            pytest.raises(
                TypeError, match=r"'.*notes.txt' is opened in text mode; .*open\(path, 'wb'\)"
            ),
        ):
            write(f, TREE)
        with (
            open(path, "rb") as f,
            pytest.raises(ValueError, match=r"model.safetensors' is not open for writing"),
        ):
            write(f, TREE)
        f = open(tmp_path / "closed.bin", "wb")
        f.close()
        with pytest.raises(ValueError, match=r"closed.bin' is closed"):
            write(f, TREE)
    assert tm.load(path, LIKE)["step"] == 3  # the file opened for reading is untouched


@pytest.mark.parametrize(
    "body, says",
    [(b"[],", "values"), (b"1,", "values"), (b'"a",', "strings")],
    ids=["empty lists", "numbers", "strings"],
)
def test_floods_of_small_values_are_refused_before_parsing(
    tmp_path: pathlib.Path, body: bytes, says: str
) -> None:
    # Parsed, 33M empty lists took 2.8 GB: counted in the raw bytes first, they are refused.
    limit = safetensors_header.MAX_VALUES if says == "values" else safetensors_header.MAX_STRINGS
    text = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[' + body * limit + b"1]}}"
    msg = _error(tmp_path, _with_header(text, b"\0"), like={"a": np.zeros(1, np.uint8)})
    assert f"its header holds about {limit + 1:,} {says}" in msg or f"{says}, more than the" in msg


def test_commas_inside_strings_do_not_count_as_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # A treemod header's metadata holds maps as JSON strings: their commas are not values.
    monkeypatch.setattr(safetensors_header, "MAX_VALUES", 50)
    inner = json.dumps({f"[{i}]": ["int", str(i)] for i in range(100)})  # 299 commas
    text = json.dumps({"__metadata__": {"treemod.values": inner, "b": 'say "a, b"'}})
    assert safetensors_header.parse_header(text.encode())[1]["treemod.values"] == inner
    outside = json.dumps({"__metadata__": {}, "a": {"x": list(range(60))}})
    with pytest.raises(safetensors_header.HeaderError, match="holds about 6[0-9] values"):
        safetensors_header.parse_header(outside.encode())
