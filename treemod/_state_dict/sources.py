"""Where `load_state_dict` reads tensors from: a mapping (NumPy, JAX or torch values) or
safetensors files, each read lazily, one tensor at a time.

torch is never imported here: a torch tensor is recognised by its methods (`detach`, `cpu`,
`numpy`) and converted through NumPy (bfloat16 through its bits, which NumPy cannot take from
torch directly).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treemod._saving.errors import CheckpointError

__all__ = ["Source", "open_source"]

# safetensors' dtype codes.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "C64": "complex64",
}


def _is_torch_tensor(x: Any) -> bool:
    return all(hasattr(x, a) for a in ("detach", "cpu", "numpy", "dtype", "shape"))


def _dtype_of(x: Any) -> np.dtype[Any]:
    name = str(x.dtype).removeprefix("torch.") if _is_torch_tensor(x) else x.dtype
    dtype: np.dtype[Any] = jnp.dtype(name)
    return dtype


def _to_array(x: Any) -> Any:
    """A NumPy or JAX array of `x`'s values (no copy where none is needed)."""
    if isinstance(x, jax.Array | np.ndarray):
        return x
    if _is_torch_tensor(x):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return t.view(sys.modules["torch"].int16).numpy().view(jnp.bfloat16)
        return t.numpy()
    return np.asarray(x)


class Source:
    """A set of named tensors: their names, shapes and dtypes up front, values on demand."""

    description: str
    path: str | None

    def names(self) -> list[str]:
        raise NotImplementedError

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        raise NotImplementedError

    def read(self, name: str) -> Any:
        raise NotImplementedError

    def where(self, name: str) -> str:
        """Where the tensor comes from, for messages (its file, when there are several)."""
        return self.description

    def close(self) -> None:
        pass


class _MappingSource(Source):
    def __init__(self, mapping: Mapping[str, Any]) -> None:
        self.mapping = mapping
        self.description = "the state dict"
        self.path = None
        bad = [k for k in mapping if not isinstance(k, str)]
        if bad:
            raise TypeError(
                f"load_state_dict: the state dict's keys must be strings (PyTorch's names); "
                f"got {bad[0]!r}."
            )

    def names(self) -> list[str]:
        return list(self.mapping)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        value = self.mapping[name]
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            value = np.asarray(value)
        return tuple(int(d) for d in value.shape), _dtype_of(value)

    def read(self, name: str) -> Any:
        return _to_array(self.mapping[name])


class _SafetensorsSource(Source):
    def __init__(self, paths: list[str]) -> None:
        import safetensors

        self.path = paths[0] if len(paths) == 1 else None
        self.description = (
            paths[0] if len(paths) == 1 else f"the checkpoint in {len(paths)} safetensors files"
        )
        self.files: list[Any] = []
        self.file_of: dict[str, tuple[str, Any]] = {}
        try:
            for path in paths:
                if not os.path.isfile(path):
                    raise CheckpointError(f"load_state_dict: {path} is not a file.")
                try:
                    f = safetensors.safe_open(path, framework="numpy")
                except Exception as e:  # safetensors raises its own error types
                    raise CheckpointError(
                        f"load_state_dict: {path} is not a readable safetensors file ({e})."
                    ) from None
                self.files.append(f)
                for name in f.keys():  # type: ignore[no-untyped-call]
                    if name in self.file_of:
                        raise CheckpointError(
                            f"load_state_dict: tensor {name!r} is in both "
                            f"{self.file_of[name][0]} and {path}."
                        )
                    self.file_of[name] = (path, f)
        except BaseException:
            self.close()
            raise

    def names(self) -> list[str]:
        return list(self.file_of)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        path, f = self.file_of[name]
        part = f.get_slice(name)
        code = part.get_dtype()
        if code not in _SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"load_state_dict: tensor {name!r} in {path} has dtype {code}, which treemod "
                f"does not read (it reads {', '.join(_SAFETENSORS_DTYPES)})."
            )
        return tuple(part.get_shape()), jnp.dtype(_SAFETENSORS_DTYPES[code])

    def read(self, name: str) -> Any:
        path, f = self.file_of[name]
        try:
            return f.get_tensor(name)
        except Exception as e:
            raise CheckpointError(
                f"load_state_dict: tensor {name!r} could not be read from {path} ({e})."
            ) from None

    def where(self, name: str) -> str:
        return self.file_of[name][0] if name in self.file_of else self.description

    def close(self) -> None:
        # safe_open handles release their memory map when dropped.
        self.files.clear()
        self.file_of.clear()


def open_source(state_dict: Any) -> Source:
    """The tensors of `state_dict`: a mapping, or a path (or paths) to `.safetensors` files."""
    if isinstance(state_dict, str | os.PathLike):
        return _SafetensorsSource([os.fspath(state_dict)])
    if isinstance(state_dict, Mapping):
        return _MappingSource(state_dict)
    if isinstance(state_dict, Iterable) and not isinstance(state_dict, bytes):
        paths = list(state_dict)
        if paths and all(isinstance(p, str | os.PathLike) for p in paths):
            return _SafetensorsSource([os.fspath(p) for p in paths])
    raise TypeError(
        "load_state_dict: `state_dict` must be a mapping of names to arrays (NumPy, JAX or "
        "torch tensors, e.g. a PyTorch model's `state_dict()`), or the path of a .safetensors "
        f"file (or a list of them); got {type(state_dict).__name__}."
    )
