"""Reading a zoo model's `config.json` as its `transformers` config class reads it: one reader.

Each family declares the values it reads, `{name: Value(default, kind)}` with the config class's
defaults. `read_config` fills the defaults for absent keys, follows the class's `attribute_map`
aliases (GPT-2's `hidden_size` is `n_embd`) and checks each declared value by its kind, so a
model is built from the numbers `transformers` would use and a wrong value is named before
anything is allocated. Checks that relate values (a divisor, a window) stay in the family.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from treemod.models._base import PretrainedConfig, config_error

__all__ = ["SHARED", "Value", "check_value", "defaults", "num_labels", "read_config"]

_KINDS = {
    "size": "a positive integer",
    "count": "an integer >= 0",
    "positive": "a finite positive number",
    "nonnegative": "a finite number >= 0",
    "prob": "a probability in [0, 1]",
    "dropout": "a probability in [0, 1]",
    "bool": "true or false",
    "any": "",
}
# Array sizes and indices are int32 in JAX.
_INT32_MAX = 2**31 - 1

# Keys whose meaning every Hugging Face config shares: whichever family reads one, it is
# checked as this kind and, for sizes, below this limit (far above any published model: a
# config past it is damaged, and building it would only fail later, out of memory).
SHARED: dict[str, tuple[str, int | None]] = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "num_decoder_layers",
            "encoder_layers",
            "decoder_layers",
        ),
        ("size", 4096),
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "num_key_value_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        ("size", 4096),
    ),
    "head_dim": ("size", 8192),
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "d_kv"),
        ("size", 2**20),
    ),
    "vocab_size": ("size", 2**24),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), ("size", 2**27)),
    **dict.fromkeys(
        ("rope_theta", "layer_norm_eps", "rms_norm_eps", "layer_norm_epsilon"), ("positive", None)
    ),
    "initializer_range": ("nonnegative", None),
}


class Value(NamedTuple):
    """One config value a family reads: the config class's default and the value's kind.

    Kinds: `"size"` (an int >= 1), `"count"` (an int >= 0), both within int32,
    `"positive"` (a finite number > 0), `"nonnegative"` (a finite number >= 0), `"prob"` (a
    number in [0, 1]), `"dropout"` (a probability, null reading as 0.0, made a float),
    `"bool"`, `"any"` (unchecked, or the kind `SHARED` gives a key every config shares). Keys
    in `SHARED` are also held below its limits.
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
    number = number and math.isfinite(value)
    integer = number and isinstance(value, int)
    ok = {
        "size": integer and 1 <= value <= _INT32_MAX,
        "count": integer and 0 <= value <= _INT32_MAX,
        "positive": number and value > 0,
        "nonnegative": number and value >= 0,
        "prob": number and 0 <= value <= 1,
        "bool": isinstance(value, bool),
        "any": True,
    }[kind]
    if not ok:
        raise config_error(owner, name, value, _KINDS[kind])
    limit = SHARED.get(name, ("", None))[1]
    if limit is not None and kind in ("size", "count") and value > limit:
        raise config_error(
            owner,
            name,
            value,
            f"{_KINDS[kind]} up to {limit:,} (no published model has more: is the config damaged?)",
        )
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
            kind = spec.kind if spec.kind != "any" else SHARED.get(name, ("any", None))[0]
            values[name] = check_value(owner, name, values[name], kind)
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
