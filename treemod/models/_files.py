"""Reading a Hugging Face checkpoint directory: `config.json`, the safetensors files, the index.

`Checkpoint` is `_saving`'s `TensorFiles` (every tensor's file, dtype, shape and offset from the
validated headers; reads of one tensor, or one slice of it, at a time) over the files a
directory names: `model.safetensors`, or the shards its index lists, checked against the index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_files import TensorFiles

__all__ = [
    "CONFIG",
    "GENERATION",
    "INDEX",
    "SINGLE",
    "Checkpoint",
    "directory_of",
    "read_config",
    "read_generation_config",
]

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
GENERATION = "generation_config.json"


def read_config(directory: Path) -> dict[str, Any]:
    """`config.json` of a checkpoint directory, as a dict; `CheckpointError` naming the file."""
    path = directory / CONFIG
    if not directory.is_dir():
        raise CheckpointError(
            f"{directory} is not a directory; from_pretrained reads a local directory in "
            f"Hugging Face's layout ({CONFIG} and {SINGLE} or {INDEX} with its shards)."
        )
    if not path.is_file():
        raise CheckpointError(
            f"{path} does not exist: a Hugging Face checkpoint directory has a {CONFIG} naming "
            f"its architecture (save one with transformers' or treemod's save_pretrained)."
        )
    return _json_object(path)


def read_generation_config(directory: Path) -> dict[str, Any] | None:
    """`generation_config.json` of a checkpoint directory, or None when it has none."""
    path = directory / GENERATION
    return _json_object(path) if path.is_file() else None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}).") from None
    except RecursionError:
        raise CheckpointError(f"{path} nests its JSON too deeply to be a config.") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a {type(value).__name__}, not a JSON object.")
    return value


class Checkpoint(TensorFiles):
    """The tensors of a checkpoint directory (one safetensors file or an index with shards).

    Arguments:
        directory: the directory holding `model.safetensors` or `model.safetensors.index.json`.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        single, index = directory / SINGLE, directory / INDEX
        if index.is_file():
            files = self._shards(index)
        elif single.is_file():
            files = [single]
        else:
            raise CheckpointError(
                f"{directory} holds neither {SINGLE} nor {INDEX}: treemod reads safetensors "
                f"weights (PyTorch's .bin pickles are not read; convert them with transformers' "
                f"save_pretrained(..., safe_serialization=True))."
            )
        super().__init__(files)
        if index.is_file():
            self._check_index(index)

    def _shards(self, index: Path) -> list[Path]:
        try:
            data = json.loads(index.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index} is not valid JSON ({e}).") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise CheckpointError(
                f"{index} has no 'weight_map' object mapping tensor names to shard files."
            )
        self._weight_map: dict[str, str] = weight_map
        files = []
        for shard in sorted(set(weight_map.values())):
            path = self.directory / shard
            if Path(shard).name != shard:
                raise CheckpointError(f"{index} names shard {shard!r}, which is not a file name.")
            if not path.is_file():
                names = sorted(k for k, v in weight_map.items() if v == shard)
                shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
                raise CheckpointError(
                    f"{index} names shard {shard!r} (holding {shown}), but {path} does not exist."
                )
            files.append(path)
        return files

    def _check_index(self, index: Path) -> None:
        for name, shard in sorted(self._weight_map.items()):
            info = self.tensors.get(name)
            if info is None or info.file.name != shard:
                where = "no shard" if info is None else str(info.file)
                raise CheckpointError(
                    f"{index} puts tensor {name!r} in {shard!r}, but {where} holds it."
                )
        extra = sorted(set(self.tensors) - set(self._weight_map))
        if extra:
            raise CheckpointError(
                f"{index} does not list tensors {', '.join(map(repr, extra[:5]))} that its "
                f"shards hold; the index and the shards are from different saves."
            )


def directory_of(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory as a `Path` (`~` expanded)."""
    return Path(os.fspath(path)).expanduser()
