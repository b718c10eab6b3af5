"""`apply_policy`: mixed precision by layer type, as a model transformation.

Each module of the model is re-classed (same fields, same tree, same state-dict names) to a
subclass whose call casts at its boundary; the classes are made once per (class, role, dtypes)
and reused, so `filter_jit` sees the same tree structure every call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from treemod._module.module import Module
from treemod._module.state import State
from treemod.nn import BatchNorm, GroupNorm, LayerNorm, RMSNorm, Stack

__all__ = ["FLOAT32_LAYERS", "Policy", "apply_policy", "policy_of", "remove_policy"]

FLOAT32_LAYERS: tuple[type, ...] = (LayerNorm, RMSNorm, GroupNorm, BatchNorm)
"""The layer types that compute in float32 under any policy (normalisation)."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A mixed-precision policy: which dtype the parameters, the computation and the output use.

    Arguments:
        compute_dtype: the dtype of the layers' arithmetic (`jnp.bfloat16` or `jnp.float16`).
        param_dtype: the dtype the parameters are kept in (the optimiser's master weights).
        output_dtype: the dtype of the model's output (and so of the loss computed from it).
        float32_layers: layer types that compute in float32 whatever `compute_dtype` is.
    """

    compute_dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.float32
    output_dtype: Any = jnp.float32
    float32_layers: tuple[type, ...] = FLOAT32_LAYERS

    def __post_init__(self) -> None:
        for name in ("compute_dtype", "param_dtype", "output_dtype"):
            dt = jnp.dtype(getattr(self, name))
            if not jnp.issubdtype(dt, jnp.floating):
                raise ValueError(f"Policy: `{name}` must be a floating dtype; got {dt}.")
            object.__setattr__(self, name, dt)


@dataclasses.dataclass(frozen=True)
class _Role:
    policy: Policy
    cast_to: Any  # the dtype of the layer's own arrays and floating inputs, or None
    root: bool  # the model itself: its floating outputs become policy.output_dtype
    stack: bool  # a Stack: its carry takes the dtype its layers return


def _is_float(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray) and jnp.issubdtype(x.dtype, jnp.floating)


def _cast(tree: Any, dtype: Any) -> Any:
    return jtu.tree_map(lambda x: x.astype(dtype) if _is_float(x) and x.dtype != dtype else x, tree)


def _rebuilt(module: Any, cls: type, changes: dict[str, Any]) -> Any:
    """`module` re-classed and with some fields changed, made as unflattening makes modules."""
    new: Any = object.__new__(cls)
    new.__dict__.update(module.__dict__)
    new.__dict__.update(changes)
    return new


def _own_arrays(module: Any) -> dict[str, Any]:
    return {k: v for k, v in module.__dict__.items() if _is_float(v)}


def _policy_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    cls = type(self)
    role, base = _ROLES[cls]
    me = self
    if role.cast_to is not None:
        own = {k: v.astype(role.cast_to) for k, v in _own_arrays(self).items()}
        me = _rebuilt(self, cls, own)
        args, kwargs = _cast((args, kwargs), role.cast_to)
    elif role.stack and args and _is_float(args[0]):
        # The scan carry must keep its dtype: give it the dtype one layer returns for it.
        x = args[0]
        out = jax.eval_shape(lambda s, x: base.__call__(s, x, *args[1:], **kwargs), self, x)
        if isinstance(out, jax.ShapeDtypeStruct) and out.dtype != x.dtype:
            args = (x.astype(out.dtype), *args[1:])
    out = base.__call__(me, *args, **kwargs)
    return _cast(out, role.policy.output_dtype) if role.root else out


def _policy_note(self: Any) -> str:
    """What treescope shows in the module's first line (`TreescopeNote`)."""
    role = _ROLES[type(self)][0]
    p = role.policy
    where = (
        "float32 layer"
        if role.cast_to == jnp.float32 and p.compute_dtype != jnp.float32
        else (
            f"computes in {jnp.dtype(role.cast_to).name}"
            if role.cast_to is not None
            else "casts nothing"
        )
    )
    text = f"precision policy: {where}, params {p.param_dtype.name}"
    return text + (f", output {p.output_dtype.name}" if role.root else "")


_CLASSES: dict[tuple[type, _Role], type] = {}
# Each generated subclass -> its role and the class it wraps (read per call: one dict lookup).
_ROLES: dict[type, tuple[_Role, type]] = {}


def _policy_class(cls: type, role: _Role) -> type:
    key = (cls, role)
    sub = _CLASSES.get(key)
    if sub is None:
        namespace = {
            "__call__": _policy_call,
            "treescope_note": _policy_note,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        }
        sub = _CLASSES[key] = type(cls)(cls.__name__, (cls,), namespace)
        _ROLES[sub] = (role, cls)
    return sub


def _base_class(cls: type) -> type:
    entry = _ROLES.get(cls)
    return cls if entry is None else entry[1]


def _children(node: Any) -> tuple[list[Any], Any]:
    return jtu.tree_flatten(node, is_leaf=lambda x: x is not node)


def _transform(node: Any, policy: Policy | None, root: bool) -> Any:
    if isinstance(node, State) or node is None or _is_float(node) or isinstance(node, jax.Array):
        return node
    children, treedef = _children(node)
    if len(children) == 1 and children[0] is node:
        return node  # a leaf (a flag, a function)
    node = jtu.tree_unflatten(treedef, [_transform(c, policy, False) for c in children])
    if not isinstance(node, Module):
        return node
    base = _base_class(type(node))
    if policy is None:
        return _rebuilt(node, base, {}) if base is not type(node) else node
    float32 = issubclass(base, policy.float32_layers)
    own = bool(_own_arrays(node))
    is_stack = issubclass(base, Stack)
    if not (own or root or is_stack or float32):
        return _rebuilt(node, base, {}) if base is not type(node) else node
    cast_to = jnp.dtype(jnp.float32) if float32 else (policy.compute_dtype if own else None)
    role = _Role(policy, cast_to, root, is_stack)
    return _rebuilt(node, _policy_class(base, role), {})


def apply_policy(model: Any, policy: Policy | Any = None, **fields: Any) -> Any:
    """Run `model` in mixed precision: parameters kept in `param_dtype` (float32), each layer's
    arithmetic in `compute_dtype`, normalisation in float32, the output in `output_dtype`.

    A transformation of the model, not of a step: the result is the same tree (same fields,
    same `treemod.state_dict` names, same leaves) whose modules cast at their boundaries, so any
    training step, `filter_jit`, `filter_grad` or `Stack` runs it unchanged. Per module:

    - a layer that holds floating arrays of its own (`Linear`, `Conv`, `Embedding`, GPT-2's
      `Conv1D`, a user's layer): its arrays and floating inputs are cast to `compute_dtype`
      inside the call, so it computes and returns `compute_dtype`; the stored arrays (and so
      the gradients and optimiser updates) stay `param_dtype`;
    - a `float32_layers` layer (LayerNorm, RMSNorm, GroupNorm, BatchNorm by default): inputs and
      arrays cast to float32; it computes and returns float32, and BatchNorm's running
      statistics are updated in float32;
    - a `Stack`: its carry takes the dtype its layers return;
    - the model itself: its floating outputs are cast to `output_dtype`;
    - everything else (containers, activations, pooling, attention's softmax) computes in the
      dtype of what it is given; treemod's attention computes its softmax in float32.

    Arguments:
        model: any treemod model.
        policy: a `Policy`, or a compute dtype (`jnp.bfloat16`, `"float16"`).
        **fields: `Policy` fields when `policy` is a dtype (e.g. `output_dtype=jnp.bfloat16`).

    Returns:
        The model under the policy, parameters cast to `param_dtype`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn, treemod.precision as precision
        >>> mlp = nn.Sequential([nn.Linear(4, 8, key=jax.random.key(0)), nn.LayerNorm(8)])
        >>> mixed = precision.apply_policy(mlp, jnp.bfloat16)
        >>> mixed(jnp.ones(4)).dtype, mixed.layers[0].weight.dtype
        (dtype('float32'), dtype('float32'))
        >>> type(mixed.layers[0]).__name__, isinstance(mixed.layers[0], nn.Linear)
        ('Linear', True)
    """
    if not isinstance(policy, Policy):
        policy = Policy(compute_dtype=jnp.bfloat16 if policy is None else policy, **fields)
    elif fields:
        raise TypeError("apply_policy: pass either a Policy or a dtype with Policy fields.")
    model = _transform(model, policy, True)
    return _cast(model, policy.param_dtype)


def remove_policy(model: Any) -> Any:
    """Undo `apply_policy`: the modules' own classes again (the arrays are kept as they are).

    Arguments:
        model: a model returned by `apply_policy`.

    Returns:
        The model computing in its parameters' dtype again.
    """
    return _transform(model, None, True)


def policy_of(model: Any) -> Policy | None:
    """The policy `apply_policy` gave `model`, or `None`.

    Arguments:
        model: a model.

    Returns:
        The `Policy`, or `None` if the model runs without one.
    """
    entry = _ROLES.get(type(model))
    return entry[0].policy if entry is not None else None
