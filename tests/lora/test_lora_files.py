"""`adapter_config.json` and `adapter_model.safetensors` as hostile input, and interrupted
saves: every damaged value is one `CheckpointError` naming the file and the key or tensor,
nothing is allocated from the config before the weights' shapes are checked, and a failed
`save_adapter` leaves the old adapter whole."""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn


def _model() -> nn.Sequential:
    return nn.Sequential([nn.Linear(4, 3, key=jax.random.key(0))])


def _tuned(r: int = 2, alpha: float = 2, seed: int = 1, **kw: Any) -> Any:
    tuned = lora.add_lora(_model(), ["0"], r=r, alpha=alpha, key=jax.random.key(seed), **kw)
    b = jax.random.normal(jax.random.key(seed + 100), (3, r))
    return tm.tree_at(lambda m: m.layers[0].lora_B.weight, tuned, b)


def _write_config(directory: Path, text: str) -> Path:
    file = directory / "adapter_config.json"
    file.write_text(text)
    return file


def _config(directory: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((directory / "adapter_config.json").read_text())
    return value


DAMAGED: list[tuple[str, Any, str]] = [
    ("not JSON", "{'r': 2", r"is not a valid JSON adapter config"),
    ("a list", [1, 2], r"holds a JSON list, not an object"),
    ("no target_modules", {"target_modules": None}, r"has no 'target_modules'"),
    ("r abc", {"r": "abc"}, r"'r' must be a positive int \(the rank\); it is 'abc'"),
    ("r 0", {"r": 0}, r"'r' must be a positive int \(the rank\); it is 0"),
    ("r -2", {"r": -2}, r"'r' must be a positive int \(the rank\); it is -2"),
    ("r 2.0", {"r": 2.0}, r"'r' must be a positive int \(the rank\); it is 2.0"),
    ("r true", {"r": True}, r"'r' must be a positive int \(the rank\); it is True"),
    ("alpha x", {"lora_alpha": "x"}, r"'lora_alpha' must be a finite positive number; it is 'x'"),
    ("alpha NaN", {"lora_alpha": math.nan}, r"'lora_alpha' must be a finite positive .* nan"),
    ("alpha inf", {"lora_alpha": math.inf}, r"'lora_alpha' must be a finite positive .* inf"),
    ("alpha -8", {"lora_alpha": -8}, r"'lora_alpha' must be a finite positive number; it is -8"),
    ("dropout 2", {"lora_dropout": 2}, r"'lora_dropout' must be a number in \[0, 1\]; it is 2"),
    ("dropout NaN", {"lora_dropout": math.nan}, r"'lora_dropout' must be a number in \[0, 1\]"),
    ("rslora str", {"use_rslora": "yes"}, r"'use_rslora' must be true or false; it is 'yes'"),
    ("targets regex", {"target_modules": "(("}, r"'target_modules' must be a regular expression"),
    ("targets []", {"target_modules": []}, r"'target_modules' must be a non-empty list"),
    ("targets ints", {"target_modules": [1]}, r"'target_modules' must be a non-empty list"),
    ("targets none match", {"target_modules": ["q_proj"]}, r"'target_modules' does not fit"),
]


@pytest.mark.parametrize(("case", "change", "message"), DAMAGED, ids=[c[0] for c in DAMAGED])
def test_a_damaged_config_is_one_error_naming_the_file_and_the_key(
    case: str, change: Any, message: str, tmp_path: Path
) -> None:
    lora.save_adapter(_tuned(), tmp_path)
    if isinstance(change, dict):
        text = json.dumps({**_config(tmp_path), **change})
    else:
        text = change if isinstance(change, str) else json.dumps(change)
    file = _write_config(tmp_path, text)
    with pytest.raises(tm.CheckpointError, match=message) as info:
        lora.load_adapter(_model(), tmp_path)
    assert f"load_adapter: {file}" in str(info.value)


def test_binary_and_oversized_configs_are_refused_by_file(tmp_path: Path) -> None:
    lora.save_adapter(_tuned(), tmp_path)
    file = tmp_path / "adapter_config.json"
    file.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(tm.CheckpointError, match=rf"{file} is not a valid JSON adapter config"):
        lora.load_adapter(_model(), tmp_path)
    file.write_bytes(b" " * ((1 << 24) + 1))
    with pytest.raises(tm.CheckpointError, match=rf"{file} is 16,777,217 bytes long"):
        lora.load_adapter(_model(), tmp_path)


def test_a_damaged_weights_file_is_refused_by_name(tmp_path: Path) -> None:
    lora.save_adapter(_tuned(), tmp_path)
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(tm.CheckpointError, match=rf"load_adapter: {weights} is damaged"):
        lora.load_adapter(_model(), tmp_path)


def test_a_huge_rank_in_the_config_is_refused_before_anything_is_allocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lora.save_adapter(_tuned(r=2), tmp_path)
    _write_config(tmp_path, json.dumps({**_config(tmp_path), "r": 1_000_000_000}))

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("adapters were built from the config before the shapes were read")

    monkeypatch.setattr(lora.LoRALinear, "wrap", never)
    weights = tmp_path / "adapter_model.safetensors"
    with pytest.raises(
        tm.CheckpointError,
        match=(
            rf"{tmp_path / 'adapter_config.json'} says 'r': 1000000000, but tensor "
            rf"'base_model.model.0.lora_A.weight' of {weights} has shape \[2, 4\]"
        ),
    ):
        lora.load_adapter(_model(), tmp_path)


def test_another_rank_names_the_adapter_shapes_and_no_base_weight(tmp_path: Path) -> None:
    lora.save_adapter(_tuned(r=2), tmp_path)
    with pytest.raises(tm.CheckpointError) as info:
        lora.load_adapter(_tuned(r=3), tmp_path)
    message = str(info.value)
    assert "the file's rank is 2, the model's 3" in message
    assert "0.lora_A.weight: the file has [2, 4], the model's adapter needs [3, 4]" in message
    assert "0.lora_B.weight: the file has [3, 2], the model's adapter needs [3, 3]" in message
    assert "base_layer" not in message and "missing" not in message


def test_a_model_with_adapters_takes_the_files_alpha_rslora_and_dropout(tmp_path: Path) -> None:
    saved = _tuned(r=2, alpha=6, use_rslora=True, dropout=0.25)
    lora.save_adapter(saved, tmp_path)
    other = nn.inference_mode(_tuned(r=2, alpha=1, seed=5))
    loaded = lora.load_adapter(other, tmp_path)
    layer = loaded.layers[0]
    assert (layer.lora_alpha, layer.use_rslora, layer.lora_dropout.p) == (6, True, 0.25)
    assert layer.lora_dropout.inference  # the model's mode is kept
    x = jax.random.normal(jax.random.key(9), (5, 4))
    np.testing.assert_allclose(loaded(x), nn.inference_mode(saved)(x), rtol=1e-6)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("where", ["weights writer", "config writer", "second rename"])
def test_a_save_that_fails_midway_leaves_the_old_adapter_whole(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lora.save_adapter(_tuned(r=2, alpha=2), tmp_path)
    before = _files(tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device")

    def raise_full(*args: Any, **kwargs: Any) -> Any:
        raise full

    if where == "weights writer":
        import treemod.lora._adapter_save as files

        monkeypatch.setattr(files, "write_tensors", raise_full)
    elif where == "config writer":
        monkeypatch.setattr(Path, "write_text", raise_full)
    else:
        real, calls = os.replace, []

        def replace_once(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            if len(calls) > 1:
                raise full
            return real(*args, **kwargs)

        monkeypatch.setattr(os, "replace", replace_once)
    with pytest.raises(OSError, match="No space left"):
        lora.save_adapter(_tuned(r=2, alpha=5, seed=3), tmp_path)
    monkeypatch.undo()
    assert _files(tmp_path) == before  # the old files, and no temporaries left
    back = lora.load_adapter(_model(), tmp_path)
    assert back.layers[0].lora_alpha == 2


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
KEYS = [
    "r",
    "lora_alpha",
    "lora_dropout",
    "use_rslora",
    "target_modules",
    "peft_type",
    "fan_in_fan_out",
    "bias",
    "use_dora",
    "rank_pattern",
]
SAVED = _tuned(r=2, alpha=2)


@given(
    changes=st.dictionaries(
        st.sampled_from(KEYS), st.one_of(JSON, st.sampled_from([2, 1, 8, 0.5, ["0"], "0"]))
    ),
    removed=st.sets(st.sampled_from(KEYS), max_size=2),
    whole=st.one_of(st.none(), JSON),
)
def test_fuzzed_configs_load_correctly_or_raise_the_clear_error(
    changes: dict[str, Any], removed: set[str], whole: Any
) -> None:
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        lora.save_adapter(SAVED, directory)
        config = {**_config(directory), **changes}
        for key in removed:
            config.pop(key, None)
        value = config if whole is None else whole
        _write_config(directory, json.dumps(value))
        try:
            loaded = lora.load_adapter(_model(), directory)
        except tm.CheckpointError as e:
            assert f"load_adapter: {directory}" in str(e)
            return
    # A correct load: the file's adapter with the config's (or PEFT's default) values.
    assert isinstance(value, dict)
    layer = loaded.layers[0]
    alpha, rslora = value.get("lora_alpha", 8), value.get("use_rslora", False)
    assert (layer.r, layer.lora_alpha, layer.use_rslora) == (2, alpha, rslora)
    want = SAVED.layers[0]
    assert jnp.array_equal(layer.lora_A.weight, want.lora_A.weight)
    assert jnp.array_equal(layer.lora_B.weight, want.lora_B.weight)
    assert layer.scaling == alpha / (math.sqrt(2) if rslora else 2)


def test_loading_into_merged_adapters_is_refused(tmp_path: Path) -> None:
    lora.save_adapter(_tuned(), tmp_path)
    merged = lora.merge(_tuned(seed=4), keep_adapters=True)
    with pytest.raises(tm.CheckpointError, match=r"LoRA layer at '0' is merged.*unmerge"):
        lora.load_adapter(merged, tmp_path)


def test_a_weights_file_with_tensors_of_no_rank_is_refused_by_tensor(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    lora.save_adapter(_tuned(), tmp_path)
    weights = tmp_path / "adapter_model.safetensors"
    save_file({"base_model.model.0.lora_A.weight": np.zeros(2, np.float32)}, str(weights))
    with pytest.raises(
        tm.CheckpointError, match=r"tensor 'base_model.model.0.lora_A.weight' .* has shape \[2\]"
    ):
        lora.load_adapter(_model(), tmp_path)


def test_a_model_with_top_level_arrays_saves_its_adapters(tmp_path: Path) -> None:
    class Scaled(tm.Module):
        scale: jax.Array
        proj: nn.Linear

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.scale * self.proj(x)

    model = Scaled(jnp.ones(()), nn.Linear(4, 4, key=jax.random.key(0)))
    tuned = lora.add_lora(model, ["proj"], r=2, alpha=2, key=jax.random.key(1))
    lora.save_adapter(tuned, tmp_path)
    back = lora.load_adapter(model, tmp_path)
    assert jnp.array_equal(back.proj.lora_A.weight, tuned.proj.lora_A.weight)
