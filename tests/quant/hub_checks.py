"""Checks the quantised-checkpoint tests share: a checkpoint directory with its
`quantization_config` changed, and the byte-for-byte comparison of two saved directories."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch as safetensors_torch
import torch


def with_config(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """`dst`: `src`'s weights (linked) with `change` applied to its `quantization_config`."""
    dst.mkdir(parents=True)
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    change(config["quantization_config"])
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def quantization_configs(ours: Path, theirs: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both directories' `quantization_config`, after checking that their tensors have the same
    names, dtypes, shapes and bytes."""
    want = safetensors_torch.load_file(theirs / "model.safetensors")
    got = safetensors_torch.load_file(ours / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name
    return tuple(  # type: ignore[return-value]
        json.loads((d / "config.json").read_text())["quantization_config"] for d in (ours, theirs)
    )


Change = Callable[[dict[str, Any]], None]


def assert_refused(src: Path, dst: Path, change: Change, word: str) -> None:
    """`from_pretrained` of `src` with `change` made to its `quantization_config` raises a
    `CheckpointError` naming `word` and the config file."""
    import pytest

    from treemod import CheckpointError
    from treemod.models import from_pretrained

    directory = with_config(src, dst, change)
    with pytest.raises(CheckpointError) as info:
        from_pretrained(directory)
    assert word in str(info.value) and str(directory / "config.json") in str(info.value)
