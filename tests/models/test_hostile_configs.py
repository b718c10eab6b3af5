"""Hostile values in a checkpoint's `config.json` are refused before anything is allocated.

Sizes far past any published model (a billion layers, a head of 10**12), non-finite or
negative numbers, and strings where numbers belong: `from_pretrained` raises a
`CheckpointError` naming the file, the class and the key, quickly, instead of running out of
memory or loading a model that outputs NaN.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import pytest

import treemod as tm
from treemod.models import (
    BertModel,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    ViTModel,
    from_pretrained,
    save_pretrained,
)

_LLAMA = {
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
_MODELS = {
    "llama": (LlamaForCausalLM, _LLAMA),
    "gpt2": (GPT2LMHeadModel, {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 64}),
    "bert": (
        BertModel,
        {
            "vocab_size": 64,
            "hidden_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        },
    ),
    "vit": (
        ViTModel,
        {
            "hidden_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "image_size": 8,
            "patch_size": 4,
        },
    ),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, Path]:
    out = {}
    for name, (cls, config) in _MODELS.items():
        directory = tmp_path_factory.mktemp(name)
        save_pretrained(cls.from_config(config, key=jax.random.key(0)), directory)
        out[name] = directory
    return out


def _with(directory: Path, **changes: Any) -> Path:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


CASES = [
    ("llama", "num_hidden_layers", 10**9),
    ("llama", "num_hidden_layers", 10**6),
    ("llama", "head_dim", 10**12),
    ("llama", "vocab_size", 2**40),
    ("llama", "initializer_range", "x"),
    ("llama", "rms_norm_eps", -1.0),
    ("llama", "rope_theta", 0),
    ("llama", "rope_theta", -1.0),
    ("llama", "rope_theta", float("nan")),
    ("llama", "rope_theta", "abc"),
    ("llama", "rope_scaling", {"rope_type": "linear", "factor": 0}),
    (
        "llama",
        "rope_scaling",
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0},
    ),
    ("gpt2", "n_layer", 10**9),
    ("gpt2", "initializer_range", "x"),
    ("gpt2", "layer_norm_epsilon", float("nan")),
    ("bert", "num_hidden_layers", 10**9),
    ("bert", "intermediate_size", 10**12),
    ("vit", "num_hidden_layers", 10**9),
]


@pytest.mark.parametrize(("name", "key", "value"), CASES)
def test_a_hostile_config_value_names_file_class_and_key(
    saved: dict[str, Path], tmp_path: Path, name: str, key: str, value: Any
) -> None:
    import shutil

    directory = Path(shutil.copytree(saved[name], tmp_path / name))
    _with(directory, **{key: value})
    cls = _MODELS[name][0]
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(directory)
    text = str(info.value)
    assert str(directory / "config.json") in text
    assert f"{cls.__name__}: config value {key}" in text
