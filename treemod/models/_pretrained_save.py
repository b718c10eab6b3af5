"""`save_pretrained`: a zoo model as a Hugging Face checkpoint directory.

The tensors are the model's `tm.state_dict` (tied aliases left out, as `transformers` writes
them), in one `model.safetensors` or, above `max_shard_size`, in shards
`model-00001-of-0000N.safetensors` with `model.safetensors.index.json`. Every file is written
under a temporary name first; the old `config.json` goes first and the new one comes last, so a
crash leaves either the old checkpoint or a directory without `config.json`, never a mix that
looks valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from treemod._saving.safetensors_write import write_tensors
from treemod._saving.sharded_write import (
    is_split,
    shared_tag,
    spans_processes,
    sync_processes,
    write_tensors_sharded,
)
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import expected_tensors, name_tensors
from treemod._transforms.eval_shape import filter_eval_shape
from treemod.models._base import PretrainedModel
from treemod.models._files import CONFIG, GENERATION, INDEX, SINGLE, directory_of
from treemod.models._names import file_name

__all__ = ["parse_size", "save_pretrained"]

_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
# What transformers writes in a weight file's header; the errors name save_pretrained.
META, CALLER = {"format": "pt"}, "save_pretrained"


def parse_size(size: int | str) -> int:
    """`max_shard_size` in bytes: an int, or `"5GB"` / `"500MiB"` / `"100KB"` as `transformers`."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)\s*", size.upper())
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    raise ValueError(
        f"save_pretrained: max_shard_size={size!r} is not a size; give a positive number of "
        f"bytes or a string such as '5GB', '500MB' or '2GiB'."
    )


def _dtype_name(tensors: dict[str, Any]) -> str:
    sizes: dict[str, int] = {}
    for value in tensors.values():
        if jnp.issubdtype(value.dtype, jnp.floating):
            name = str(jnp.dtype(value.dtype))
            sizes[name] = sizes.get(name, 0) + int(value.size) * value.dtype.itemsize
    return max(sizes, key=lambda k: sizes[k]) if sizes else "float32"


def save_pretrained(
    model: PretrainedModel, path: str | os.PathLike[str], *, max_shard_size: int | str = "5GB"
) -> None:
    """Write `model` as a Hugging Face checkpoint directory that `transformers` loads.

    The directory gets `config.json` (the model's config with `architectures`, `model_type`
    and `dtype` set, as `transformers` 5 writes them) and the weights in safetensors files
    (metadata `{"format": "pt"}`): one `model.safetensors`, or shards and
    `model.safetensors.index.json` when they exceed `max_shard_size`. Tied weights are written
    once, under the name they are tied to. The generation defaults the model was loaded with
    (`model.config.generation`) go to `generation_config.json`. Other files in the directory (a
    tokenizer) are kept; old weight files and generation config are replaced. Quantised layers
    are written as `transformers` loads them, with their `quantization_config`: `NF4Linear`
    (and FP4) and `Int8Linear` in its bitsandbytes layout, `Int4Linear` as GPTQ, and layers
    loaded from GPTQ, AWQ or compressed-tensors files as they were read.

    A model split over devices is written a shard at a time, never a whole tensor on the host.
    When its arrays span processes, every process calls `save_pretrained` with the same `path`
    (on a disk they all see): each writes the shards it holds into the files, and process 0
    the rest, so no host gathers the model.

    Arguments:
        model: a zoo model (`PretrainedModel`).
        path: the directory (created if needed).
        max_shard_size: the largest shard, in bytes or as `"5GB"`, `"500MB"`, `"2GiB"`; a
            tensor larger than it gets a shard of its own.

    Returns:
        None.

    Example:
        >>> import os, tempfile, jax
        >>> from treemod.models import save_pretrained
        >>> from treemod.models.gpt2 import GPT2Model
        >>> config = {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 50}
        >>> model = GPT2Model.from_config(config, key=jax.random.key(0))
        >>> directory = tempfile.mkdtemp()
        >>> save_pretrained(model, directory, max_shard_size="4KB")
        >>> sorted(os.listdir(directory))[:2]
        ['config.json', 'model-00001-of-00013.safetensors']
        >>> "model.safetensors.index.json" in os.listdir(directory)
        True
    """
    if not isinstance(model, PretrainedModel):
        raise TypeError(
            f"save_pretrained: {type(model).__name__} is not a treemod.models.PretrainedModel; "
            f"for another model save tm.state_dict(model) with safetensors.numpy.save_file."
        )
    limit = parse_size(max_shard_size)
    directory = directory_of(path)
    named = name_tensors(model, NATIVE_HOOKS)
    # Quantised layers go in transformers' bitsandbytes layout (treemod/quant/_hub.py).
    from treemod.quant._hub import hub_save

    named, quantization, float_names = hub_save(model, named, model.tied_weights())
    _check_structure(model, float_names)
    for alias in model.tied_weights():
        named.pop(alias, None)
    tensors = {file_name(name, type(model).save_renames): value for name, value in named.items()}
    config = model.config.to_dict()
    config["architectures"] = [type(model).architecture]
    config["model_type"] = type(model).model_type
    config["dtype"] = _dtype_name(tensors)
    config.pop("torch_dtype", None)
    config.pop("quantization_config", None)
    if quantization is not None:
        config["quantization_config"] = quantization

    shards: list[list[str]] = [[]]
    size = 0
    for name, value in tensors.items():
        nbytes = int(value.size) * value.dtype.itemsize
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    if len(shards) == 1:
        files = {SINGLE: shards[0]}
    else:
        n = len(shards)
        files = {f"model-{i + 1:05d}-of-{n:05d}.safetensors": s for i, s in enumerate(shards)}

    # Arrays split across processes: every process calls this and writes its shards into
    # files process 0 creates (sharded_write.py); process 0 alone writes the rest.
    across = spans_processes(tensors.values())
    lead = not across or jax.process_index() == 0
    tag = shared_tag() if across else os.getpid()
    directory.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, Path]] = []  # (temporary, final)
    try:
        for file, names in files.items():
            temporary = directory / f".tmp-{tag}-{file}"
            written.append((temporary, directory / file))
            pairs = [(n, tensors[n]) for n in names]
            if across or any(is_split(v) for _, v in pairs):
                write_tensors_sharded(temporary, pairs, META, CALLER)  # a shard at a time
            else:
                write_tensors(temporary, pairs, META, CALLER)
                _fsync(temporary)
        if not lead:
            sync_processes(f"{CALLER}: {directory} renamed")
            return
        if len(files) > 1:
            total = sum(int(v.size) * v.dtype.itemsize for v in tensors.values())
            index = {
                "metadata": {"total_size": total},
                "weight_map": {n: file for file, names in files.items() for n in names},
            }
            written.append(_write_json(directory, INDEX, index))
        if model.config.generation is not None:
            generation = model.config.generation.to_dict()
            written.append(_write_json(directory, GENERATION, generation))
        written.append(_write_json(directory, CONFIG, config))
    except BaseException:
        for temporary, _ in written:
            with contextlib.suppress(OSError):
                temporary.unlink()
        raise
    # The old checkpoint stops looking valid first (its config.json goes), then its weight
    # files, then the new files take their names, config.json last.
    (directory / CONFIG).unlink(missing_ok=True)
    keep = {final.name for _, final in written}
    for old in directory.iterdir():
        stale = old.name in (SINGLE, INDEX, GENERATION) or _SHARD.match(old.name)
        if stale and old.name not in keep:
            old.unlink()
    for temporary, final in written:
        os.replace(temporary, final)
    if across:
        sync_processes(f"{CALLER}: {directory} renamed")


def _check_structure(model: PretrainedModel, have: set[str]) -> None:
    """Refuse a model whose tensors are not its class's (unmerged LoRA adapters, a replaced
    layer): `transformers` could not load the files, nor could `from_pretrained`. `have` is
    the model's tensor names, each quantised layer's arrays counted as its float `weight`."""
    cls = type(model)
    abstract_key = jax.eval_shape(jax.random.key, 0)
    own = filter_eval_shape(lambda k: cls.from_config(model.config, key=k), abstract_key)
    want = set(expected_tensors(own, NATIVE_HOOKS))
    if want == have:
        return
    extra, missing = sorted(have - want), sorted(want - have)
    shown = ", ".join(extra[:4]) + (" ..." if len(extra) > 4 else "")
    hint = ""
    if any(".lora_" in n or ".base_layer." in n for n in extra):
        hint = (
            " It holds LoRA adapters: merge them into the weights first "
            "(treemod.lora.merge(model), or unload(model) to drop them), or save the adapters "
            "alone with treemod.lora.save_adapter."
        )
    raise ValueError(
        f"save_pretrained: the {cls.__name__} holds tensors its transformers class does not "
        f"have ({len(extra)}: {shown}) and lacks {len(missing)} it has, so neither "
        f"transformers nor from_pretrained could load the files.{hint}"
    )


def _fsync(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(directory: Path, name: str, value: Any) -> tuple[Path, Path]:
    temporary = directory / f".tmp-{os.getpid()}-{name}"
    with temporary.open("w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return temporary, directory / name
