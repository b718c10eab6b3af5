"""PEFT's adapter directories (`adapter_config.json` + `adapter_model.safetensors`): their
names and `load_adapter`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_files import TensorFiles
from treemod._state_dict.api import load_state_dict
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import expected_tensors

from ._layers import LoRALayer
from ._merge import is_lora_layer
from ._modules_to_save import (
    module_tensors,
    saved_modules,
)
from ._select import rewrite_named, wrap_targets

__all__ = ["CONFIG", "PREFIX", "WEIGHTS", "adapted_layers", "is_adapter_tensor", "load_adapter"]

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_PARTS = (".lora_A.", ".lora_B.")
MAX_CONFIG_BYTES = 1 << 24  # an adapter_config.json is a few hundred bytes; refuse a huge one
# PEFT's defaults (LoraConfig) for the values a config may leave out.
_DEFAULTS: dict[str, Any] = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0, "use_rslora": False}

# Config values of PEFT's LoraConfig that change what an adapter computes, with the value
# treemod implements (anything else is refused by name rather than loaded as something else).
_REQUIRED: dict[str, Any] = {
    "use_dora": False,
    "bias": "none",
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "layers_pattern": None,
    "exclude_modules": None,
    "target_parameters": None,
    "lora_bias": False,
    "use_qalora": False,
    "trainable_token_indices": None,
    "alora_invocation_tokens": None,
}


def adapted_layers(model: Any) -> dict[str, LoRALayer]:
    found: dict[str, LoRALayer] = {}

    def visit(node: Any, name: str) -> Any:
        if is_lora_layer(node):
            found[name] = node
            return node
        return None

    rewrite_named(model, visit)
    return found


def is_adapter_tensor(name: str, layers: dict[str, LoRALayer]) -> bool:
    """Whether `name` is an adapter tensor (`<layer>.lora_A.weight`) of one of `layers`; names
    with fewer parts (a model's top-level `logit_scale`) are not."""
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and f".{parts[1]}." in _PARTS and parts[0] in layers


def _bad(file: Path, key: str, value: Any, want: str) -> CheckpointError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return CheckpointError(
        f"load_adapter: {file}: {key!r} must be {want}; it is {shown}. Fix the file (PEFT "
        "writes it with LoraConfig.save_pretrained) or save the adapter again."
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_config(path: Path) -> dict[str, Any]:
    """`adapter_config.json`, every value treemod uses checked for type, range and finiteness
    (the rank is checked against the weights' shapes before anything is allocated)."""
    file = path / CONFIG
    if not file.is_file():
        raise CheckpointError(
            f"load_adapter: {file} does not exist; an adapter directory holds {CONFIG} and "
            f"{WEIGHTS}."
        )
    try:
        size = file.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise CheckpointError(
                f"load_adapter: {file} is {size:,} bytes long; an adapter config is a small JSON "
                f"object (at most {MAX_CONFIG_BYTES:,} bytes are read). The file is damaged."
            )
        raw = file.read_bytes()[: MAX_CONFIG_BYTES + 1]
        config = json.loads(raw.decode("utf-8"))
    except CheckpointError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"load_adapter: {file} is not a valid JSON adapter config ({type(e).__name__}: "
            f"{str(e)[:200]}); fix it or save the adapter again."
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"load_adapter: {file} holds a JSON {type(config).__name__}, not an object; an "
            "adapter config is an object with keys such as 'r', 'lora_alpha', 'target_modules'."
        )
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise CheckpointError(
            f"load_adapter: {file} has peft_type={peft_type!r}; treemod.lora reads LORA adapters."
        )
    for k, want in _REQUIRED.items():
        got = config.get(k, want)
        if (
            got != want
            and not (want is None and got in ([], {}, ""))
            and not (want == {} and got is None)
        ):
            raise CheckpointError(
                f"load_adapter: {file} sets {k}={got!r}; treemod.lora implements only {k}={want!r} "
                "(plain LoRA on Linear and Conv layers)."
            )
    if "target_modules" not in config or config["target_modules"] is None:
        raise CheckpointError(
            f"load_adapter: {file} has no 'target_modules'; treemod needs the adapted modules' "
            "names (a list of names, or a regular expression) to place the adapters."
        )
    targets = config["target_modules"]
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except (re.error, RecursionError, OverflowError) as e:
            raise _bad(file, "target_modules", targets, f"a regular expression ({e})") from None
    elif not (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)):
        raise _bad(file, "target_modules", targets, "a non-empty list of module names or a str")
    whole = config.get("modules_to_save")
    if whole is not None and not (
        isinstance(whole, list) and all(isinstance(m, str) and m for m in whole)
    ):
        raise _bad(file, "modules_to_save", whole, "null or a list of module names")
    out: dict[str, Any] = {"target_modules": targets, "modules_to_save": whole or []}
    values = {k: config.get(k, default) for k, default in _DEFAULTS.items()}
    r = values["r"]
    if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
        raise _bad(file, "r", r, "a positive int (the rank)")
    alpha = values["lora_alpha"]
    if not (_is_number(alpha) and 0 < alpha < math.inf):
        raise _bad(file, "lora_alpha", alpha, "a finite positive number")
    dropout = values["lora_dropout"]
    if not (_is_number(dropout) and 0 <= dropout <= 1):
        raise _bad(file, "lora_dropout", dropout, "a number in [0, 1]")
    if not isinstance(values["use_rslora"], bool):
        raise _bad(file, "use_rslora", values["use_rslora"], "true or false")
    fan = config.get("fan_in_fan_out", False)
    if not isinstance(fan, bool):
        raise _bad(file, "fan_in_fan_out", fan, "true or false")
    out.update(values)
    out["lora_dropout"] = float(dropout)
    return out


def _check_ranks(weights: Path, shapes: dict[str, tuple[int, ...]], r: int, file: Path) -> None:
    """Each tensor of the file is an adapter's A or B of rank `r` (A: `(r, in, ...)`, B:
    `(out, r, ...)`): the config's `r` is checked against the data before anything is built."""
    for name, shape in sorted(shapes.items()):
        part = ".lora_A." if ".lora_A." in name else ".lora_B." if ".lora_B." in name else None
        if part is None:
            continue  # an unexpected tensor: named with the others below
        axis = 0 if part == ".lora_A." else 1
        if len(shape) < 2 or shape[axis] != r:
            raise CheckpointError(
                f"load_adapter: {file} says 'r': {r}, but tensor {PREFIX + name!r} of {weights} "
                f"has shape {list(shape)} (a {part.strip('.')} weight of rank r has shape "
                f"{'[r, in, ...]' if axis == 0 else '[out, r, ...]'}). The config and the "
                "weights do not belong together: fix 'r' or save the adapter again."
            )


def _read_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """The tensors' shapes, from the validated header (no tensor is read)."""
    return {i.name: i.shape for i in TensorFiles([weights], "load_adapter").tensors.values()}


def _load_arrays(weights: Path, names: set[str]) -> dict[str, np.ndarray]:
    files = TensorFiles([weights], "load_adapter")
    return {name: files.read(name) for name in sorted(names)}


def _take_config(model: Any, config: dict[str, Any], file: Path) -> Any:
    """The model's adapters with the file's `lora_alpha`, `use_rslora` and `lora_dropout` (as
    PEFT, where these travel with the adapter); a merged one is refused."""

    def visit(node: Any, name: str) -> Any:
        if not is_lora_layer(node):
            return None
        if node.merged:
            raise CheckpointError(
                f"load_adapter: the LoRA layer at {name!r} is merged into its weight; loading "
                f"{file.parent} would leave the old update in it. Call treemod.lora.unmerge(model) "
                "(or unload) first."
            )
        dropout = dataclasses.replace(node.lora_dropout, p=config["lora_dropout"])
        return dataclasses.replace(
            node,
            lora_alpha=config["lora_alpha"],
            use_rslora=config["use_rslora"],
            lora_dropout=dropout,
        )

    return rewrite_named(model, visit)


def _set_mode(model: Any, inference: bool) -> Any:
    def visit(node: Any, name: str) -> Any:
        if not is_lora_layer(node):
            return None
        return dataclasses.replace(
            node, lora_dropout=dataclasses.replace(node.lora_dropout, inference=inference)
        )

    return rewrite_named(model, visit)


def load_adapter(model: Any, path: str | os.PathLike[str], *, is_trainable: bool = False) -> Any:
    """Read a PEFT adapter directory (written by `peft`'s `save_pretrained` or by
    `save_adapter`) into a model.

    A model without adapters gets them first, as the config says (`target_modules`, `r`,
    `lora_alpha`, `lora_dropout`, `use_rslora`). A model with adapters has their arrays
    replaced and takes the file's `lora_alpha`, `use_rslora` and `lora_dropout`, as PEFT does
    (these belong to the adapter); its adapters' shapes (rank, modules) must match the file's.
    Every value of the config is checked (type, range, finiteness), and its rank against the
    weights' shapes, before anything is allocated; every tensor of the file must find its
    place and every adapter its tensor. Each problem is one `treemod.CheckpointError` naming
    the file and the key or tensor.

    The modules the config's `modules_to_save` selects (PEFT's: a name or the end of one; a
    classifier head) take the file's tensors whole.

    As PEFT's `PeftModel.from_pretrained`, the adapters come in inference mode (their dropout
    off), so the model runs without a key; `is_trainable=True` gives them in training mode.

    Arguments:
        model: the base model (or one with adapters of the same rank and modules).
        path: the directory.
        is_trainable: the adapters' dropout on (training) rather than off (inference).

    Returns:
        The model with the file's adapters.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
        >>> tuned = lora.add_lora(mlp, ["0"], r=2, alpha=2, key=jax.random.key(1))
        >>> d = tempfile.mkdtemp(); lora.save_adapter(tuned, d)
        >>> back = lora.load_adapter(mlp, d)
        >>> bool(jnp.array_equal(back.layers[0].lora_A.weight, tuned.layers[0].lora_A.weight))
        True
    """
    where = Path(path)
    config = _read_config(where)
    file = where / CONFIG
    weights = where / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"load_adapter: {weights} does not exist.")
    shapes = _read_shapes(weights)
    outside = sorted(k for k in shapes if not k.startswith(PREFIX))
    found = {k[len(PREFIX) :]: v for k, v in shapes.items() if k.startswith(PREFIX)}
    _check_ranks(weights, found, config["r"], file)
    if adapted_layers(model):
        model = _take_config(model, config, file)
    else:
        try:
            model = wrap_targets(
                model,
                config["target_modules"],
                config["r"],
                config["lora_alpha"],
                dropout=config["lora_dropout"],
                use_rslora=config["use_rslora"],
                key=jax.random.key(0),
                bound_rank=False,  # the rank is the file's tensors', checked above
            )
        except ValueError as e:
            raise CheckpointError(
                f"load_adapter: {file}: 'target_modules' does not fit the model: {e}"
            ) from None
    try:
        # PEFT lists every head name of the task (`classifier` and `score`); a model has one.
        whole = saved_modules(
            model, config["modules_to_save"], "load_adapter", each_must_match=False
        )
    except ValueError as e:
        raise CheckpointError(f"load_adapter: {file}: {e}") from None
    every = expected_tensors(model, NATIVE_HOOKS)
    kept = set(module_tensors(list(every), list(whole)))
    expected = {
        name: tuple(s.shape)
        for name, s in every.items()
        if any(p in name for p in _PARTS) or name in kept
    }
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected or outside:
        raise CheckpointError(
            f"load_adapter: {weights} does not fit the model's adapters: "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {(outside + [PREFIX + u for u in unexpected])[:5]} (adapter tensors are "
            f"named '{PREFIX}<module>.lora_A.weight', those of modules_to_save "
            f"'{PREFIX}<module>.weight'; check target_modules, modules_to_save and the model "
            "class)."
        )
    heads = [
        f"{PREFIX + n}: the file has {list(found[n])}, the model's {n!r} has {list(s)}"
        for n, s in sorted(expected.items())
        if n in kept and found[n] != s
    ]
    if heads:
        raise CheckpointError(
            f"load_adapter: {weights} holds modules_to_save tensors of other shapes than the "
            f"model's: {'; '.join(heads[:4])}. Build the model with the head the adapter was "
            "trained with (e.g. its num_labels)."
        )
    wrong = [
        f"{PREFIX + n}: the file has {list(found[n])}, the model's adapter needs {list(s)}"
        for n, s in sorted(expected.items())
        if found[n] != s
    ]
    if wrong:
        ranks = sorted({m.r for m in adapted_layers(model).values()})
        raise CheckpointError(
            f"load_adapter: {weights} does not fit the model's adapters (the file's rank is "
            f"{config['r']}, the model's {ranks if len(ranks) > 1 else ranks[0]}): "
            + "; ".join(wrong[:6])
            + (" ..." if len(wrong) > 6 else "")
            + ". Load it into the model without adapters (treemod.lora.unload) to take the "
            "file's rank."
        )
    model = _set_mode(model, inference=not is_trainable)
    tensors = _load_arrays(weights, {PREFIX + n for n in found})
    loaded, report = load_state_dict(
        model, {k[len(PREFIX) :]: v for k, v in tensors.items()}, strict=False
    )
    if report.mismatched or report.unexpected:
        problems = [m.reason for m in report.mismatched] + list(report.unexpected)
        raise CheckpointError(f"load_adapter: {weights}: {'; '.join(problems[:6])}")
    return loaded
