"""`save_adapter`: a model's adapters (and modules saved whole) as PEFT writes them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from treemod._saving.atomic_file import replace_set_atomically
from treemod._saving.safetensors_write import write_tensors
from treemod._saving.sharded_write import (
    shared_tag,
    spans_processes,
    sync_processes,
    write_tensors_sharded,
)
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import name_tensors

from ._files import CONFIG, PREFIX, WEIGHTS, adapted_layers, is_adapter_tensor
from ._layers import LoRALinear
from ._modules_to_save import (
    default_modules,
    default_task_type,
    module_tensors,
    saved_modules,
    task_heads,
)

__all__ = ["save_adapter"]

CALLER = "save_adapter"
META = {"format": "pt"}


def _one(values: set[Any], what: str) -> Any:
    if len(values) != 1:
        raise ValueError(
            f"save_adapter: the model's LoRA layers differ in {what} ({sorted(map(str, values))}); "
            "PEFT's adapter_config.json holds one value (per-layer ranks are not written)."
        )
    return values.pop()


def save_adapter(
    model: Any,
    path: str | os.PathLike[str],
    *,
    base_model_name_or_path: str | None = None,
    task_type: str | None = None,
    modules_to_save: Sequence[str] | None = None,
) -> None:
    """Write the model's adapters as PEFT does (`PeftModel.save_pretrained`): a directory with
    `adapter_config.json` and `adapter_model.safetensors`, tensors named
    `base_model.model.<module name>.lora_A.weight` / `.lora_B.weight` in PyTorch's layout, so
    `peft.PeftModel.from_pretrained(hf_model, path)` loads them.

    `target_modules` is written as the list of the adapted modules' full names (PEFT selects
    exactly those). Adapters split across processes (an FSDP model): every process calls it
    with the same path, on a disk all of them see, and writes the shards it holds; no process
    gathers an array. The modules trained whole (`modules_to_save`, PEFT's name) are written
    with all their tensors, `base_model.model.<module name>.weight`, as PEFT writes them.

    Arguments:
        model: a model with LoRA layers (`add_lora`), not merged.
        path: the directory (created if needed).
        base_model_name_or_path: recorded in the config, as PEFT does.
        task_type: PEFT's `task_type` (`"CAUSAL_LM"`, `"SEQ_CLS"`, ...); default: the zoo
            model's (`PretrainedModel.peft_task_type`), else none; none too for a classifier
            whose head is adapted rather than trained whole (PEFT's `SEQ_CLS` and
            `TOKEN_CLS` models save the head whole; its plain `PeftModel` loads these).
        modules_to_save: modules saved whole (trained with `trainable(model,
            modules_to_save)`), each selected by a name or the end of one; default: the head
            PEFT saves for the task type (`classifier` or `score` for `SEQ_CLS` and
            `TOKEN_CLS`), else none; `[]` for none.

    Example:
        >>> import jax, tempfile, os, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
        >>> tuned = lora.add_lora(mlp, ["0"], r=2, alpha=2, key=jax.random.key(1))
        >>> d = tempfile.mkdtemp(); lora.save_adapter(tuned, d)
        >>> sorted(os.listdir(d))
        ['adapter_config.json', 'adapter_model.safetensors']
    """
    layers = adapted_layers(model)
    if not layers:
        raise ValueError("save_adapter: the model has no LoRA layers (add them with add_lora).")
    merged = [n for n, m in layers.items() if m.merged]
    if merged:
        raise ValueError(
            f"save_adapter: the LoRA layers {merged[:3]} are merged into their weights; call "
            "treemod.lora.unmerge(model) first (a merged model would load with the update twice)."
        )
    task_type = task_type or default_task_type(model)
    if modules_to_save is None:
        modules_to_save = default_modules(model, task_type)
        whole = saved_modules(model, modules_to_save or [], "save_adapter", each_must_match=False)
    else:
        modules_to_save = list(modules_to_save)
        whole = saved_modules(model, modules_to_save, "save_adapter")
    heads = task_heads(model, task_type)
    if set(heads) - set(whole):
        raise ValueError(
            f"save_adapter: task_type {task_type!r} adapters hold the heads {sorted(heads)} "
            "whole, unadapted and float (PEFT's loader reads them from the file, and fails "
            "without them); keep the default modules_to_save and a float head without "
            "adapters, or pass task_type=... of another task."
        )
    named = name_tensors(model, NATIVE_HOOKS)
    kept = set(module_tensors(list(named), list(whole)))
    tensors = {
        PREFIX + name: value
        for name, value in named.items()
        if is_adapter_tensor(name, layers) or name in kept
    }
    fan = {isinstance(m, LoRALinear) and m.fan_in_fan_out for m in layers.values()}
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
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
        "modules_to_save": modules_to_save or None,
        "use_dora": False,
    }
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    items = list(tensors.items())
    if spans_processes(v for _, v in items):
        _save_across_processes(out, text, items)
        return
    # Config and weights are written as a set: both to temporaries first, then renamed, so a
    # failure (a full disk) leaves the old adapter whole (see atomic_file.py).
    replace_set_atomically(
        [
            (str(out / CONFIG), lambda tmp: Path(tmp).write_text(text)),
            (str(out / WEIGHTS), lambda tmp: write_tensors(tmp, items, META, CALLER)),
        ],
        caller=CALLER,
    )


def _save_across_processes(out: Path, text: str, items: list[tuple[str, Any]]) -> None:
    """`save_adapter` of adapters split across processes (every process calls it, with the
    same path on a disk all of them see): each writes the shards it holds into one weights
    file (`write_tensors_sharded`; no process gathers an array), and process 0 renames it and
    the config into place as a set."""
    weights = out / f".tmp-{shared_tag()}-{WEIGHTS}"
    write_tensors_sharded(weights, items, META, CALLER)
    if jax.process_index() == 0:
        try:
            replace_set_atomically(
                [
                    (str(out / CONFIG), lambda tmp: Path(tmp).write_text(text)),
                    (str(out / WEIGHTS), lambda tmp: os.replace(weights, tmp)),
                ],
                caller=CALLER,
            )
        finally:
            weights.unlink(missing_ok=True)
    sync_processes(f"{CALLER}: {out} renamed")
