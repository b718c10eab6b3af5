"""PEFT's `modules_to_save`: whole modules (a classifier head) trained and saved beside the
adapters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax.tree_util as jtu

from treemod._module.module import Module

from ._layers import LoRALayer
from ._select import AdaptedAsLinear, rewrite_named

__all__ = [
    "TASK_HEADS",
    "TaskTyped",
    "default_modules",
    "default_task_type",
    "module_tensors",
    "saved_modules",
    "task_heads",
    "task_type_of",
    "trainable_ids",
]

# The heads PEFT adds to `modules_to_save` for a task type (`PeftModelForSequenceClassification`
# and `PeftModelForTokenClassification` add both names; a model has at most one of them).
TASK_HEADS: dict[str, tuple[str, ...]] = {
    "SEQ_CLS": ("classifier", "score"),
    "TOKEN_CLS": ("classifier", "score"),
}


@runtime_checkable
class TaskTyped(Protocol):
    """A model that names PEFT's `task_type` for its adapters (every `treemod.models` class)."""

    @classmethod
    def peft_task_type(cls) -> str | None: ...


def task_type_of(model: Any) -> str | None:
    """The model's PEFT `task_type` (`TaskTyped`), else None."""
    return model.peft_task_type() if isinstance(model, TaskTyped) else None


def _modules(model: Any) -> dict[str, Any]:
    """Every named sub-module (not array) of `model`, by `treemod.state_dict`'s names."""
    found: dict[str, Any] = {}

    def visit(node: Any, name: str) -> Any:
        if name and isinstance(node, Module):
            found[name] = node
        return None

    rewrite_named(model, visit)
    return found


def saved_modules(
    model: Any, entries: Sequence[str], caller: str, *, each_must_match: bool = True
) -> dict[str, Any]:
    """The modules `entries` select, PEFT's way (`_set_trainable`: a module whose name ends
    with an entry), outermost only.

    Arguments:
        model: the model.
        entries: PEFT's `modules_to_save` (module names or name endings).
        caller: the public function, for the errors.
        each_must_match: refuse an entry that selects nothing (else it is skipped, as PEFT's
            loading skips the task's head name a model does not have).

    Returns:
        `{name: module}`.

    Raises:
        ValueError: an entry that is not a non-empty str, an entry that selects nothing, a
            selected module holding LoRA layers (PEFT refuses both on one module) or a
            quantised layer (`treemod.quant`'s, whose float arrays are scales).
    """
    bad = [e for e in entries if not isinstance(e, str) or not e]
    if bad:
        raise ValueError(
            f"{caller}: modules_to_save holds {bad[:3]}; it is a list of module names."
        )
    modules = _modules(model)
    chosen = _select(modules, entries)
    if each_must_match:
        unmatched = [e for e in entries if not any(n.endswith(e) for n in chosen)]
        if unmatched:
            heads = sorted(n for n in modules if "." not in n)
            raise ValueError(
                f"{caller}: modules_to_save entry {unmatched[0]!r} selects no module of the "
                f"{type(model).__name__} (an entry selects the modules whose name ends with it; "
                f"the top-level modules are {heads[:8]})."
            )
    for name, module in chosen.items():
        inner = [x for x in jtu.tree_leaves(module, is_leaf=_is_lora) if _is_lora(x)]
        if inner or _is_lora(module):
            raise ValueError(
                f"{caller}: modules_to_save selects {name!r}, which holds LoRA layers; a module is "
                "either adapted (target_modules) or saved whole (modules_to_save), as in PEFT."
            )
        # A quantised layer's float arrays are its scales: training them is not training the
        # head, and PEFT cannot load them (nor train a bitsandbytes head). Probes (no caller:
        # which heads a model has) do not train or save.
        quantised = [x for x in jtu.tree_leaves(module, is_leaf=_is_quantised) if _is_quantised(x)]
        if caller and quantised:
            raise ValueError(
                f"{caller}: modules_to_save selects {name!r}, which holds a quantised "
                f"{type(quantised[0]).__name__}; a head trained whole stays float (PEFT's too). "
                "Leave it out of treemod.quant.quantise's target_modules (transformers: "
                "llm_int8_skip_modules), or train adapters only (modules_to_save=[], and for "
                "save_adapter a task_type without a head)."
            )
    return chosen


def _select(modules: dict[str, Any], entries: Sequence[str]) -> dict[str, Any]:
    """PEFT's selection (a name ending with an entry), outermost only, unchecked."""
    chosen = {n: m for n, m in modules.items() if any(n.endswith(e) for e in entries)}
    return {n: m for n, m in chosen.items() if not any(n.startswith(o + ".") for o in chosen)}


def _adapted(module: Any) -> bool:
    """Whether a module is or holds a LoRA layer."""
    return any(_is_lora(x) for x in jtu.tree_leaves(module, is_leaf=_is_lora))


def task_heads(model: Any, task_type: str | None) -> dict[str, Any]:
    """The heads PEFT adds to `modules_to_save` for `task_type` that the model has."""
    heads = TASK_HEADS.get(task_type or "")
    return _select(_modules(model), heads) if heads else {}


def default_task_type(model: Any) -> str | None:
    """The model's PEFT `task_type`, or None when its task's head is adapted rather than
    trained whole (PEFT's `SEQ_CLS`/`TOKEN_CLS` models always save the head whole and never
    adapt it; its plain `PeftModel` loads such adapters)."""
    task = task_type_of(model)
    if any(_adapted(m) for m in task_heads(model, task).values()):
        return None
    return task


def _is_quantised(x: Any) -> bool:
    return isinstance(x, AdaptedAsLinear) and not isinstance(x, LoRALayer)


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoRALayer)


def module_tensors(names: Sequence[str], modules: Sequence[str]) -> list[str]:
    """The tensor names (of `names`, a model's state-dict names) inside `modules`."""
    return [n for n in names if any(n.startswith(m + ".") for m in modules)]


def default_modules(model: Any, task_type: str | None) -> list[str] | None:
    """PEFT's `modules_to_save` for `task_type` (the classifier head of `SEQ_CLS` and
    `TOKEN_CLS`), or None when the task adds none, the model has none of those heads, or its
    head is adapted (not trained whole). A quantised head is selected, and refused by the
    callers: it cannot be trained whole, and a classifier's head is new."""
    heads = task_heads(model, task_type)
    if not heads or any(_adapted(m) for m in heads.values()):
        return None
    return list(TASK_HEADS[task_type or ""])


def trainable_ids(model: Any, entries: Sequence[str] | None, caller: str) -> set[int]:
    """The ids of the arrays of the modules `entries` select (for a filter spec); `None`
    selects the model's task's head (`default_modules`).

    Raises:
        ValueError: as `saved_modules`, or a selected module inside a `Stack` (its arrays are
            slices of the stacked ones, which a filter spec cannot mark per layer).
    """
    if entries is None:
        entries = default_modules(model, task_type_of(model))
        if entries is None:
            return set()
        chosen = saved_modules(model, entries, caller, each_must_match=False)
    else:
        chosen = saved_modules(model, entries, caller)
    leaves = {id(x) for x in jtu.tree_leaves(model)}
    ids: set[int] = set()
    for name, module in chosen.items():
        mine = {id(x) for x in jtu.tree_leaves(module)}
        if not mine <= leaves:
            raise ValueError(
                f"{caller}: modules_to_save selects {name!r}, a module inside a Stack; a "
                "Stack's layers share their arrays, so train the whole Stack's arrays or none."
            )
        ids |= mine
    return ids
