"""PEFT's adapter directories: `adapter_config.json` + `adapter_model.safetensors`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from treemod._saving.errors import CheckpointError
from treemod._state_dict.api import load_state_dict, state_dict
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import expected_tensors

from ._layers import LoRALayer, LoRALinear
from ._merge import is_lora_layer
from ._select import add_lora, rewrite_named

__all__ = ["load_adapter", "save_adapter"]

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_PARTS = (".lora_A.", ".lora_B.")

# Config values of PEFT's LoraConfig that change what an adapter computes, with the value
# treemod implements (anything else is refused by name rather than loaded as something else).
_REQUIRED: dict[str, Any] = {
    "use_dora": False,
    "bias": "none",
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "layers_pattern": None,
    "modules_to_save": None,
    "exclude_modules": None,
    "target_parameters": None,
    "lora_bias": False,
    "use_qalora": False,
    "trainable_token_indices": None,
    "alora_invocation_tokens": None,
}


def _adapted(model: Any) -> dict[str, LoRALayer]:
    found: dict[str, LoRALayer] = {}

    def visit(node: Any, name: str) -> Any:
        if is_lora_layer(node):
            found[name] = node
            return node
        return None

    rewrite_named(model, visit)
    return found


def _one(values: set[Any], what: str) -> Any:
    if len(values) != 1:
        raise ValueError(
            f"save_adapter: the model's LoRA layers differ in {what} ({sorted(map(str, values))}); "
            "PEFT's adapter_config.json holds one value (per-layer ranks are not written)."
        )
    return values.pop()


def save_adapter(
    model: Any, path: str | os.PathLike[str], *, base_model_name_or_path: str | None = None
) -> None:
    """Write the model's adapters as PEFT does (`PeftModel.save_pretrained`): a directory with
    `adapter_config.json` and `adapter_model.safetensors`, tensors named
    `base_model.model.<module name>.lora_A.weight` / `.lora_B.weight` in PyTorch's layout, so
    `peft.PeftModel.from_pretrained(hf_model, path)` loads them.

    `target_modules` is written as the list of the adapted modules' full names (PEFT selects
    exactly those).

    Arguments:
        model: a model with LoRA layers (`add_lora`), not merged.
        path: the directory (created if needed).
        base_model_name_or_path: recorded in the config, as PEFT does.

    Example:
        >>> import jax, tempfile, os, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
        >>> tuned = lora.add_lora(mlp, ["0"], r=2, alpha=2, key=jax.random.key(1))
        >>> d = tempfile.mkdtemp(); lora.save_adapter(tuned, d)
        >>> sorted(os.listdir(d))
        ['adapter_config.json', 'adapter_model.safetensors']
    """
    from safetensors.numpy import save_file

    layers = _adapted(model)
    if not layers:
        raise ValueError("save_adapter: the model has no LoRA layers (add them with add_lora).")
    merged = [n for n, m in layers.items() if m.merged]
    if merged:
        raise ValueError(
            f"save_adapter: the LoRA layers {merged[:3]} are merged into their weights; call "
            "treemod.lora.unmerge(model) first (a merged model would load with the update twice)."
        )
    tensors = {
        PREFIX + name: np.ascontiguousarray(value)
        for name, value in state_dict(model).items()
        if any(f".{name.rsplit('.', 2)[-2]}." in p for p in _PARTS)
        and name.rsplit(".", 2)[0] in layers
    }
    fan = {isinstance(m, LoRALinear) and m.fan_in_fan_out for m in layers.values()}
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name_or_path,
        "inference_mode": True,
        "r": _one({m.r for m in layers.values()}, "r"),
        "lora_alpha": _one({m.lora_alpha for m in layers.values()}, "lora_alpha"),
        "lora_dropout": _one({float(m.lora_dropout.p) for m in layers.values()}, "lora_dropout"),
        "use_rslora": _one({m.use_rslora for m in layers.values()}, "use_rslora"),
        "fan_in_fan_out": True in fan,
        "target_modules": sorted(layers),
        "bias": "none",
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_dora": False,
    }
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})


def _read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG
    if not file.is_file():
        raise CheckpointError(
            f"load_adapter: {file} does not exist; an adapter directory holds {CONFIG} and "
            f"{WEIGHTS}."
        )
    config: dict[str, Any] = json.loads(file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(
            f"load_adapter: {file} has peft_type={config.get('peft_type')!r}; treemod.lora "
            "reads LORA adapters."
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
    return config


def load_adapter(model: Any, path: str | os.PathLike[str]) -> Any:
    """Read a PEFT adapter directory (written by `peft`'s `save_pretrained` or by
    `save_adapter`) into a model.

    A model without adapters gets them first, as the config says (`target_modules`, `r`,
    `lora_alpha`, `lora_dropout`, `use_rslora`); a model with adapters has their arrays
    replaced. Every tensor of the file must find its place and every adapter its tensor, else
    one `treemod.CheckpointError` names them.

    Arguments:
        model: the base model (or one with matching adapters).
        path: the directory.

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
    from safetensors.numpy import load_file

    where = Path(path)
    config = _read_config(where)
    weights = where / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"load_adapter: {weights} does not exist.")
    if not _adapted(model):
        model = add_lora(
            model,
            config["target_modules"],
            int(config["r"]),
            config.get("lora_alpha", 8),
            dropout=float(config.get("lora_dropout", 0.0)),
            use_rslora=bool(config.get("use_rslora", False)),
            key=jax.random.key(0),
        )
    raw = load_file(str(weights))
    outside = sorted(k for k in raw if not k.startswith(PREFIX))
    tensors = {k[len(PREFIX) :]: v for k, v in raw.items() if k.startswith(PREFIX)}
    wanted = {
        name for name in expected_tensors(model, NATIVE_HOOKS) if any(p in name for p in _PARTS)
    }
    missing = sorted(wanted - set(tensors))
    unexpected = sorted(set(tensors) - wanted)
    if missing or unexpected or outside:
        raise CheckpointError(
            f"load_adapter: {weights} does not fit the model's adapters: "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {(outside + [PREFIX + u for u in unexpected])[:5]} (adapter tensors are "
            f"named '{PREFIX}<module>.lora_A.weight'; check target_modules and the model class)."
        )
    loaded, report = load_state_dict(model, tensors, strict=False)
    if report.mismatched or report.unexpected:
        raise CheckpointError(f"load_adapter: {weights}: {report.describe()}")
    return loaded
