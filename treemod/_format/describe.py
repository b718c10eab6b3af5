"""How treemod writes arrays and values in reprs and error messages: `f32[3,4]`, `int 3`.

One format everywhere (module reprs, `tree_pformat`, shape-check, retrace, state, transform and
checkpoint errors), so that a shape seen in one message can be searched for in another.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["describe_array", "describe_value", "short_dtype"]


def short_dtype(dtype: Any) -> str:
    """A dtype's short name: `float32` -> `f32`, `bfloat16` -> `bf16`, `uint8` -> `u8`.

    Arguments:
        dtype: a NumPy or JAX dtype, a scalar type such as `jnp.float32`, or a dtype's name.

    Returns:
        The name with `float`, `uint`, `int` and `complex` contracted to `f`, `u`, `i` and `c`;
        other names (`bool`, PRNG keys' `key<fry>`) unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod._format.describe import short_dtype
        >>> short_dtype(jnp.bfloat16), short_dtype("complex64"), short_dtype(jnp.bool_)
        ('bf16', 'c64', 'bool')
    """
    if isinstance(dtype, str):
        name = dtype
    else:  # extended dtypes (PRNG keys) have a name but no NumPy equivalent
        name = getattr(dtype, "name", None) or np.dtype(dtype).name
    for long, short in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        name = name.replace(long, short)
    return name


def describe_array(shape: tuple[int, ...], dtype: Any, weak_type: bool = False) -> str:
    """An array's dtype and shape: `f32[3,4]`; a weakly typed one gets ` (weak type)`.

    Example:
        >>> from treemod._format.describe import describe_array
        >>> describe_array((3, 4), "float32"), describe_array((), "int32", weak_type=True)
        ('f32[3,4]', 'i32[] (weak type)')
    """
    text = f"{short_dtype(dtype)}[{','.join(map(str, shape))}]"
    return text + " (weak type)" if weak_type else text


def describe_value(value: Any, _depth: int = 0) -> str:
    """A short description of any value, for an error message.

    Arrays (and anything with `shape` and `dtype`, named by type when it is not a JAX array) by
    `describe_array`; tuples, lists and dicts item by item (six items, three levels deep); simple
    scalars and strings by type and value; anything else by its type's name.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from treemod._format.describe import describe_value
        >>> describe_value((jnp.zeros(3), None, 3))
        '(f32[3], None, int 3)'
        >>> describe_value(np.zeros((2, 1), np.int8))
        'i8[2,1] (numpy.ndarray)'
    """
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        text = describe_array(value.shape, value.dtype)
        if not isinstance(value, jax.Array):
            text += f" ({type(value).__module__.split('.')[0]}.{type(value).__qualname__})"
        return text
    if value is None:
        return "None"
    if _depth < 3 and isinstance(value, tuple | list):
        items = [describe_value(v, _depth + 1) for v in value[:6]]
        if len(value) > 6:
            items.append("...")
        body = ", ".join(items)
        if isinstance(value, tuple):
            return f"({body}{',' if len(value) == 1 else ''})"
        return f"[{body}]"
    if _depth < 3 and isinstance(value, dict):
        items = [f"{k!r}: {describe_value(v, _depth + 1)}" for k, v in list(value.items())[:6]]
        return "{" + ", ".join(items) + "}"
    if isinstance(value, bool | int | float | complex | str):
        text = repr(value)
        return f"{type(value).__name__} {text[:40]}"
    return type(value).__qualname__
