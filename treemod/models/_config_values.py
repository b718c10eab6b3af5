"""Reading a zoo model's `config.json` as its `transformers` config class reads it: one reader.

Each family declares the values it reads, `{name: Value(default, kind)}` with the config class's
defaults. `read_config` fills the defaults for absent keys, follows the class's `attribute_map`
aliases (GPT-2's `hidden_size` is `n_embd`) and checks each declared value by its kind, so a
model is built from the numbers `transformers` would use and a wrong value is named before
anything is allocated. Checks that relate values (a divisor, a window) stay in the family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from treemod.models._base import PretrainedConfig, config_error

__all__ = ["Value", "check_value", "defaults", "num_labels", "read_config"]

_KINDS = {
    "size": "a positive integer",
    "count": "an integer >= 0",
    "positive": "a positive number",
    "prob": "a probability in [0, 1]",
    "dropout": "a probability in [0, 1]",
    "bool": "true or false",
    "any": "",
}


class Value(NamedTuple):
    """One config value a family reads: the config class's default and the value's kind.

    Kinds: `"size"` (an int >= 1), `"count"` (an int >= 0), `"positive"` (a number > 0),
    `"prob"` (a number in [0, 1]), `"dropout"` (a probability, null reading as 0.0, made a
    float), `"bool"`, `"any"` (unchecked). With `nullable`, null is accepted as it is.
    """

    default: Any
    kind: str = "any"
    nullable: bool = False


def check_value(owner: str, name: str, value: Any, kind: str) -> Any:
    """`value` if it is of `kind` (see `Value`); else `config_error`'s `CheckpointError`.

    Arguments:
        owner: the model class's name, for messages.
        name: the config key.
        value: its value.
        kind: one of `Value`'s kinds.

    Returns:
        The value (a `"dropout"` as a float, null as 0.0).
    """
    if kind == "dropout":
        if value is None:
            return 0.0
        kind = "prob"
        value = check_value(owner, name, value, kind)
        return float(value)
    number = not isinstance(value, bool) and isinstance(value, int | float)
    integer = number and isinstance(value, int)
    ok = {
        "size": integer and value >= 1,
        "count": integer and value >= 0,
        "positive": number and value > 0,
        "prob": number and 0 <= value <= 1,
        "bool": isinstance(value, bool),
        "any": True,
    }[kind]
    if not ok:
        raise config_error(owner, name, value, _KINDS[kind])
    return value


def read_config(
    owner: str,
    config: Mapping[str, Any],
    declared: Mapping[str, Value],
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`config` with the declared defaults for absent keys and each declared value checked.

    Arguments:
        owner: the model class, for messages.
        config: the config dict.
        declared: the values the family reads, `{name: Value(default, kind)}`.
        aliases: `{alias: canonical}` (the config class's `attribute_map`).

    Returns:
        A plain dict (nested `PretrainedConfig`s made dicts again) of every config key, aliases
        read under their canonical names.
    """
    plain = config.to_dict() if isinstance(config, PretrainedConfig) else dict(config)
    for alias, canonical in (aliases or {}).items():
        if alias in plain and canonical not in plain:
            plain[canonical] = plain[alias]
    values = defaults(declared)
    values.update(plain)
    for name, spec in declared.items():
        if not (spec.nullable and values[name] is None):
            values[name] = check_value(owner, name, values[name], spec.kind)
    return values


def defaults(declared: Mapping[str, Value]) -> dict[str, Any]:
    """The declared values' defaults, `{name: default}`."""
    return {name: spec.default for name, spec in declared.items()}


def num_labels(owner: str, config: Mapping[str, Any]) -> int:
    """How many labels `transformers` counts: `id2label`'s size, else `num_labels`, else 2.

    Arguments:
        owner: the model class's name, for messages.
        config: the config.

    Returns:
        The number of labels (0 gives a head that is the identity, as in `transformers`).
    """
    id2label = config.get("id2label")
    given = config.get("num_labels")
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 0):
        raise config_error(owner, "num_labels", given, "a non-negative integer")
    if id2label is None:
        return 2 if given is None else given
    if not isinstance(id2label, Mapping):
        raise config_error(owner, "id2label", id2label, "a mapping from label index to name")
    if given is not None and given != len(id2label):
        raise config_error(
            owner,
            "num_labels",
            given,
            f"the size of id2label, {len(id2label)}, or no num_labels",
        )
    return len(id2label)
