"""`clear_caches`: drop the compiled programs treemod keeps (Equinox's `clear_caches`)."""

from __future__ import annotations

from treemod._transforms.jit_sharing import all_shared_caches

__all__ = ["clear_caches"]


def clear_caches() -> None:
    """Forget every compiled version `filter_jit` keeps, so their memory can be freed.

    The next call of each `filter_jit` function traces and compiles again (its trace count
    goes on from where it was). JAX keeps caches of its own: call `jax.clear_caches()`
    after this one to drop those too (it takes seconds in a process that has compiled
    thousands of programs, which all compile again when next used).

    Returns:
        Nothing.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> f = tm.filter_jit(lambda x: x + 1)
        >>> _ = f(jnp.ones(2))
        >>> tm.clear_caches()
        >>> _ = f(jnp.ones(2))
        >>> tm.debug.get_num_traces(f)
        2
    """
    for cache in all_shared_caches():
        cache.clear()
