"""`enable_compile_cache`: JAX's persistent compilation cache, set up so small models cache too."""

from __future__ import annotations

import os
import pathlib

import jax

from treemod._private_apis import reset_compilation_cache

__all__ = ["enable_compile_cache"]


def enable_compile_cache(
    path: str | os.PathLike[str],
    *,
    min_compile_time_secs: float = 0.0,
    min_entry_size_bytes: int = -1,
) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in `path`, caching every compiled program.

    Compiled executables are written to disk and reused by later processes, so the first call
    of a training step in a new process skips XLA compilation (tracing still runs). JAX's
    defaults only cache programs that took over a second to compile; these defaults cache
    everything, which is what helps small models and tests.

    A program is found again only if it lowers to the same computation: static values whose
    hash differs between processes and that shape the program (iterating a `set` of strings,
    whose order follows `PYTHONHASHSEED`) give new cache keys; functions and lambdas in static
    fields do not. Call this before the first compilation; calling it later resets JAX's cache
    handle so it takes effect anyway.

    Arguments:
        path: the cache directory (created if missing); share it between processes.
        min_compile_time_secs: only cache programs that took at least this long to compile.
        min_entry_size_bytes: only cache executables at least this large (`-1`: no limit).

    Returns:
        The cache directory as an absolute path.

    Example:
        >>> import tempfile, treemod as tm
        >>> path = tm.enable_compile_cache(tempfile.mkdtemp())  # doctest: +SKIP
    """
    directory = pathlib.Path(path).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(min_entry_size_bytes))
    reset_compilation_cache()  # pick up the new directory even if something was compiled already
    return directory
