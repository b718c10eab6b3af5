"""Tensor names in Hugging Face files against the zoo models' names.

A zoo model's names are its `transformers` class's `state_dict()` keys (`tm.state_dict`'s
rule). The files can differ from them in three ways, each handled as `transformers` 5 does:

- **A conversion mapping**: some `transformers` 5 classes were rewritten with new module names
  but still read and write the old names on disk (`transformers/conversion_mapping.py`). ViT
  keeps `vit.encoder.layer.0.attention.attention.query.weight` in files for the module's
  `vit.layers.0.attention.q_proj.weight`. A zoo class declares them (`load_renames`, applied in
  order when loading, and `save_renames`, their inverses), so treemod's files are what
  `transformers` writes.
- **The base model's prefix**: a checkpoint of the base model (`GPT2Model`: `h.0...`) loads into
  the model with a head (`GPT2LMHeadModel`: `transformer.h.0...`), and a checkpoint with a
  head into the base model (the head's tensors are then unexpected: `strict=False`).
- **Legacy LayerNorm names**: `LayerNorm.gamma` / `LayerNorm.beta` (old BERT checkpoints) for
  `LayerNorm.weight` / `LayerNorm.bias`.

Old files also hold buffers the model has no place for (GPT-2's causal mask `h.0.attn.bias`),
which `transformers` skips by its class's `keys_to_ignore_on_load_unexpected`; so does treemod,
by the zoo class's attribute of that name (`ignored`).

The last two apply to a name only where it makes the name one the model expects.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["base_prefix", "file_name", "ignored", "model_names"]

_LEGACY = [
    (re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"),
    (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias"),
]


def ignored(name: str, model_cls: type) -> bool:
    """Whether an unexpected tensor `name` is one `transformers` skips when loading the class:
    one of its `keys_to_ignore_on_load_unexpected` (GPT-2's causal-mask buffers `attn.bias`,
    Llama's `rotary_emb.inv_freq`) matching the end of the name from a dot on.

    `transformers` searches the patterns anywhere in the name, so its GPT-2 pattern `attn.bias`
    also hides an unexpected `h.2.attn.c_attn.bias` (a tensor of a layer the config does not
    have); matching whole trailing components skips the buffers only."""
    patterns = getattr(model_cls, "keys_to_ignore_on_load_unexpected", ())
    return any(re.search(rf"(?:^|\.)(?:{p})$", name) for p in patterns)


def _apply(name: str, renames: Iterable[tuple[str, str]]) -> str:
    for pattern, replacement in renames:
        name = re.sub(pattern, replacement, name)
    return name


def base_prefix(model: Any) -> str | None:
    """The field holding the base model inside a model with a head (`transformer` in GPT-2's
    `GPT2LMHeadModel`): the class's `base_model_prefix` when the model has that field, else the
    field whose value is itself a zoo model; None for a base model."""
    from treemod.models._base import PretrainedModel

    if not dataclasses.is_dataclass(model):
        return None
    declared = getattr(type(model), "base_model_prefix", "")
    names = [field.name for field in dataclasses.fields(model)]
    if declared and declared in names:
        return str(declared)
    for name in names:
        if isinstance(getattr(model, name, None), PretrainedModel):
            return name
    return None


def model_names(
    files: Iterable[str],
    expected: Mapping[str, Any],
    load: Iterable[tuple[str, str]],
    prefix: str | None,
) -> dict[str, str]:
    """`{name as the model calls it: name in the files}` for every tensor in the files, with
    the class's `load` renames (`PretrainedModel.load_renames`)."""
    load = tuple(load)
    out: dict[str, str] = {}
    names = list(files)
    converted = {f: _apply(f, load) for f in names}
    # Prefix: add the base model's (a base checkpoint into a model with a head) or strip one
    # (a checkpoint with a head into a base model), whichever makes more names expected.
    add = strip = None
    hits = sum(n in expected for n in converted.values())
    if prefix is not None:
        added = sum(f"{prefix}.{n}" in expected for n in converted.values())
        if added > hits:
            add = prefix
    else:
        firsts = {n.split(".", 1)[0] for n in converted.values() if "." in n}
        for first in sorted(firsts):
            stripped = sum(
                n.split(".", 1)[1] in expected
                for n in converted.values()
                if n.startswith(first + ".")
            )
            if stripped > hits:
                strip, hits = first, stripped
    for file, name in converted.items():
        if add is not None and f"{add}.{name}" in expected:
            name = f"{add}.{name}"
        elif (
            strip is not None and name.startswith(strip + ".") and name.split(".", 1)[1] in expected
        ):
            name = name.split(".", 1)[1]
        if name not in expected:
            for pattern, replacement in _LEGACY:
                candidate = pattern.sub(replacement, name)
                if candidate in expected:
                    name = candidate
        out.setdefault(name, file)
    return out


def file_name(name: str, save: Iterable[tuple[str, str]]) -> str:
    """The name `transformers` writes to its files for the model's tensor `name`, with the
    class's `save` renames (`PretrainedModel.save_renames`)."""
    return _apply(name, save)
