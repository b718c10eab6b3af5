"""The one table of dtypes a safetensors file may hold, and how treemod stores each.

Every reader and writer of safetensors files in treemod (`tm.save`/`tm.load`, `from_pretrained`,
`save_pretrained`, `load_state_dict` of a file, LoRA adapters) looks dtypes up here, never by
name elsewhere: a file's dtype code maps to a NumPy dtype through `CODE_TO_NAME` and `DTYPES`,
so all of them read the same set (complex64, the float8 variants, ...).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

__all__ = ["CODE_TO_NAME", "DTYPES", "STANDARD", "dtype_name", "file_dtype", "storage"]

# Dtype name -> safetensors code, for the dtypes that safetensors (and PyTorch) know.
STANDARD = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
}
CODE_TO_NAME = {code: name for name, code in STANDARD.items()}

_ML_NAMES = (
    "bfloat16 float8_e3m4 float8_e4m3 float8_e4m3b11fnuz float8_e4m3fn float8_e4m3fnuz "
    "float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn float6_e2m3fn float6_e3m2fn "
    "int1 int2 int4 uint1 uint2 uint4"
).split()
_NUMPY_NAMES = (
    "bool uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64 "
    "complex64 complex128"
).split()

# The only dtypes a file may name: looked up in this table, never by getattr on file contents.
DTYPES: dict[str, np.dtype] = {n: np.dtype(n) for n in _NUMPY_NAMES}
DTYPES.update({n: np.dtype(getattr(ml_dtypes, n)) for n in _ML_NAMES if hasattr(ml_dtypes, n)})


def dtype_name(dtype_like: DTypeLike) -> str:
    """The name under which `dtype_like` is stored; raises `TypeError` for unsupported dtypes."""
    dtype = np.dtype(dtype_like)
    name = dtype.name
    if DTYPES.get(name) != dtype.newbyteorder("="):
        raise TypeError(
            f"dtype {dtype} cannot be saved: checkpoints hold bool, integer, floating, complex "
            "and ml_dtypes arrays."
        )
    return name


def storage(name: str, shape: tuple[int, ...]) -> tuple[str, list[int]]:
    """The safetensors dtype code and shape under which an array of dtype `name` is stored.

    Standard dtypes are stored as themselves. complex128 is stored as F64 with a trailing axis of
    2 (real, imaginary); other dtypes as their raw bytes: U8 with the same shape when they take
    one byte an element (int4, float8 variants, ...), else with a trailing axis of the item size.
    """
    if name in STANDARD:
        return STANDARD[name], list(shape)
    if name == "complex128":
        return "F64", [*shape, 2]
    itemsize = DTYPES[name].itemsize
    return "U8", list(shape) if itemsize == 1 else [*shape, itemsize]


def file_dtype(code: str) -> np.dtype | None:
    """The NumPy dtype of a safetensors dtype code (`"BF16"`), None for one treemod does not
    read."""
    name = CODE_TO_NAME.get(code)
    return None if name is None else DTYPES[name]
