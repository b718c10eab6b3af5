"""Reading a language model's `config.json` as its `transformers` config class reads it.

`resolve` fills the class's defaults for absent keys, follows its `attribute_map` aliases
(GPT-2's `hidden_size` is `n_embd`), and checks each value's kind, so a model is built from the
numbers `transformers` would use and a wrong value is named before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treemod.models._base import PretrainedConfig, config_error

__all__ = ["resolve", "check_int", "check_dropout"]


def resolve(
    owner: str,
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`config` with `defaults` for the absent keys, aliases read under their canonical names.

    Arguments:
        owner: the model class, for messages.
        config: the config dict.
        defaults: the `transformers` config class's defaults.
        aliases: `{alias: canonical}` (the class's `attribute_map`).

    Returns:
        A plain dict (nested `PretrainedConfig`s made dicts again).
    """
    values = dict(defaults)
    plain = config.to_dict() if isinstance(config, PretrainedConfig) else dict(config)
    for alias, canonical in (aliases or {}).items():
        if alias in plain and canonical not in plain:
            plain[canonical] = plain[alias]
    values.update(plain)
    return values


def check_int(owner: str, values: Mapping[str, Any], name: str, minimum: int = 1) -> int:
    """`values[name]` if it is an int `>= minimum` (a size); else a `CheckpointError` naming it."""
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise config_error(owner, name, value, f"an int >= {minimum}")
    return value


def check_dropout(owner: str, values: Mapping[str, Any], name: str) -> float:
    """`values[name]` as a float probability in [0, 1]; `None` reads as 0."""
    value = values.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise config_error(owner, name, value, "a probability in [0, 1]")
    return float(value)
