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

from treemod._saving.safetensors_files import TensorFiles

__all__ = ["Source", "open_source"]


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
        self.path = paths[0] if len(paths) == 1 else None
        self.description = (
            paths[0] if len(paths) == 1 else f"the checkpoint in {len(paths)} safetensors files"
        )
        self.files = TensorFiles(paths, "load_state_dict")

    def names(self) -> list[str]:
        return list(self.files.tensors)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
        info = self.files.tensors[name]
        return info.shape, info.dtype

    def read(self, name: str) -> Any:
        return self.files.read(name)

    def where(self, name: str) -> str:
        info = self.files.tensors.get(name)
        return str(info.file) if info is not None else self.description


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
