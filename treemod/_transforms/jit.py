"""`filter_jit`: `jax.jit` where arrays are traced and every other leaf is static.

`JitWrapped` is what `filter_jit` returns. Its per-call path (`JitWrapped.__call__`) is one
C++ flatten of `(fn_tree, args, kwargs)`, one lookup of the leaf types' classification
(`KINDS`), two `compress` passes, one dict lookup of the key in its `JitCache` (`jit_cache.py`:
what the key is made of, when a version is valid, threads) and the compiled call. A miss
makes a version: one `jax.jit` of a function that rebuilds the arguments and calls the
wrapped function (`_new_version`). An output with non-array leaves comes back as a
`HeldPacked` with only arrays as leaves, which keeps JAX's C++ dispatch path, and is rebuilt
after the call; nothing blocks.

`in_shardings=`/`out_shardings=` cost nothing per call: a version is made with the input
shardings of its array leaves (`jax.jit`'s `in_shardings`) and constrains its outputs inside
the trace, so the call path is the same with or without them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from itertools import compress
from typing import Any, Generic, Literal, overload

import jax
import jax.tree_util as jtu

from treemod._format.paths import function_name
from treemod._format.retrace import aval_of
from treemod._transforms.error_if import runtime_check_error
from treemod._transforms.jit_cache import (
    KINDS,
    JitCache,
    Key,
    TraceCount,
    call_key,
    snapshot_structure,
    static_key,
)
from treemod._transforms.jit_sharing import share
from treemod._transforms.leaves import merge_leaves, pack_output, unpack_output
from treemod._transforms.roll import trace_maybe_rolled
from treemod._transforms.shard import filter_shard
from treemod._transforms.unhashable import unhashable_error
from treemod._transforms.wrapper import P, R, TransformedFunction, split_fn

__all__ = ["Compiled", "JitWrapped", "Lowered", "filter_jit"]

Donate = Literal["all", "all-except-first", "warn", "warn-except-first", "none"]
_DONATE_MODES = ("all", "all-except-first", "warn", "warn-except-first", "none")
UNUSED_DONATION = "Some donated buffers were not usable"
_flatten = jtu.tree_flatten


def _is_placement(x: Any) -> bool:
    return x is None or isinstance(x, jax.sharding.Sharding)


def _hashable(shardings: Any) -> Any:
    """A hashable stand-in for a shardings prefix (dicts included), for the sharing key."""
    leaves, treedef = jtu.tree_flatten(shardings, is_leaf=_is_placement)
    return treedef, tuple(leaves)


def _arg_shardings(in_shardings: Any, args_def: Any) -> list[Any]:
    """One sharding (or `None`, unspecified) per leaf of the positional arguments."""
    per_leaf: list[Any] = [None] * args_def.num_leaves
    numbered = args_def.unflatten(range(args_def.num_leaves))

    def assign(sharding: Any, sub: Any) -> None:
        for i in jtu.tree_leaves(sub):
            per_leaf[i] = sharding

    if _is_placement(in_shardings):
        in_shardings = (in_shardings,) * len(args_def.children())
    try:
        jtu.tree_map(assign, in_shardings, numbered, is_leaf=_is_placement)
    except ValueError as e:
        raise ValueError(
            "filter_jit(in_shardings=...) must be a Sharding or a pytree prefix of the "
            f"positional arguments (a tuple, one entry per argument): {e}"
        ) from None
    return per_leaf


def _raise_check_error(error: Exception) -> None:
    """Raise the `RuntimeCheckError` an `error_if` inside the program raised, if it was one."""
    check = runtime_check_error(error)
    if check is not None:
        raise check from None


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn`, renamed: JAX names the program (and nested calls in it) after the function."""
    fn.__name__ = fn.__qualname__ = name
    return fn


class _Donating:
    """A version that donates the array arguments after its first `kept` ones."""

    __slots__ = ("jitted", "kept", "quiet")

    def __init__(self, jitted: Any, kept: int, quiet: bool) -> None:
        self.jitted, self.kept, self.quiet = jitted, kept, quiet

    def __call__(self, dynamic: list[Any]) -> Any:
        k = self.kept
        if not self.quiet:
            return self.jitted(dynamic[:k], dynamic[k:])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=UNUSED_DONATION)
            return self.jitted(dynamic[:k], dynamic[k:])


class JitWrapped(TransformedFunction[P, R]):
    """A function compiled by `filter_jit`: call it as the function it wraps.

    Typed as that function (`JitWrapped[P, R]` is called with `f`'s parameters and returns
    its result). Besides calling it: `.lower(*args)` for ahead-of-time compilation,
    `.with_max_traces(n)`, `.num_traces`, `.retrace_explanations`, and `.cache`, the
    compiled versions it shares with other wrappers of the same function.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> double = tm.filter_jit(lambda x: 2 * x)
        >>> isinstance(double, tm.JitWrapped)
        True
        >>> double(jnp.ones(2)), double.num_traces
        (Array([2., 2.], dtype=float32), 1)
    """

    def __init__(
        self,
        fn: Callable[P, R],
        donate: str,
        explain_retraces: bool | None,
        in_shardings: Any = None,
        out_shardings: Any = None,
    ) -> None:
        self._fn: Any = fn
        self._fn_tree, call = split_fn(fn)
        self._donate = donate
        self._explain = explain_retraces
        self._shardings = (in_shardings, out_shardings)
        self._name = function_name(fn)
        options: tuple[Any, ...] = (donate, explain_retraces)
        if in_shardings is not None or out_shardings is not None:
            options += (_hashable(in_shardings), _hashable(out_shardings))
        self._cache, self._caller = share(fn, self._fn_tree, call, options)
        self._versions = self._cache.versions
        self._wraps(fn)

    # The per-call path: keep it short (see the module docstring).
    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        sig_id, mask, not_mask, floats = KINDS[tuple(map(type, leaves))]
        static = tuple(compress(leaves, not_mask))
        key = (treedef, sig_id, static_key(static, floats) if floats else static)
        try:
            version = self._versions[key]
        except KeyError:
            return self._miss(key, mask, static, list(compress(leaves, mask)))  # type: ignore[no-any-return]
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        try:  # costs nothing unless raised
            return unpack_output(version(list(compress(leaves, mask))))  # type: ignore[no-any-return]
        except jax.errors.JaxRuntimeError as e:
            _raise_check_error(e)
            raise

    def __repr__(self) -> str:
        return f"filter_jit({self._name})"

    @property
    def cache(self) -> JitCache:
        """The compiled versions this function shares with other wrappers of it."""
        return self._cache

    def _count(self) -> TraceCount | None:
        """This callable's trace count (its static parts' own), or `None` before any trace."""
        try:
            return self._cache.counts.get(jtu.tree_structure(self._fn_tree))
        except TypeError:  # an unhashable static field: never traced
            return None

    @property
    def num_traces(self) -> int:
        """How many times the function has been traced (compiled versions made)."""
        count = self._count()
        return 0 if count is None else count.num_traces

    @property
    def retrace_explanations(self) -> list[str]:
        """The lines the retrace explainer has logged so far."""
        count = self._count()
        return [] if count is None else count.log

    def with_max_traces(self, max_traces: int | None) -> JitWrapped[P, R]:
        """A copy with its own compiled versions and trace count, failing past `max_traces`.

        Arguments:
            max_traces: the most traces allowed (`None`: count only).

        Returns:
            A new `JitWrapped` of the same function and options.
        """
        new: JitWrapped[P, R] = JitWrapped(self._fn, self._donate, self._explain, *self._shardings)
        new._cache = JitCache(max_traces)
        new._versions = new._cache.versions
        return new

    def _raise_unhashable(self, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> None:
        error = unhashable_error("filter_jit", self._fn, (self._fn_tree, args, kwargs))
        if error is not None:
            raise error from None

    def _version_for(
        self, key: Key, mask: tuple[bool, ...], static: tuple[Any, ...]
    ) -> tuple[Key, Callable[[list[Any]], Any], bool]:
        """`(stored key, version, made)`: the stored version, else a new one, stored."""
        key = (snapshot_structure(key[0]), key[1], key[2])
        version = self._new_version(key, mask, static)  # cheap: nothing is traced yet
        cache = self._cache
        with cache.lock:
            found = cache.versions.get(key)
            if found is None:
                cache.add(key, version, self._name)
                return key, version, True
        return key, found, False

    def _miss(
        self, key: Key, mask: tuple[bool, ...], static: tuple[Any, ...], dynamic: list[Any]
    ) -> Any:
        """Make, store and run a new version; drop it again if its first call raises."""
        key, version, made = self._version_for(key, mask, static)
        try:
            out = version(dynamic)
        except BaseException as e:
            if made:
                self._cache.discard(key, version)
            if isinstance(e, jax.errors.JaxRuntimeError):
                _raise_check_error(e)
            raise
        return unpack_output(out)

    def _new_version(
        self, key: Key, mask: tuple[bool, ...], static: tuple[Any, ...]
    ) -> Callable[[list[Any]], Any]:
        """A `jax.jit` of the wrapped function for the calls with this key."""
        treedef = key[0]
        count = self._cache.count_for(treedef.children()[0])
        # Only what the trace needs: a reference to `self` (or to a module held by `self._fn`)
        # would keep the wrapper, or the module's arrays, alive as long as the cache.
        caller, name, flag = self._caller, self._name, self._explain
        in_shardings, out_shardings = self._shardings

        def run(dynamic: list[Any]) -> Any:
            fn_tree, args, kwargs = treedef.unflatten(merge_leaves(mask, dynamic, static))
            out = caller(fn_tree, args, kwargs)
            if out_shardings is not None:
                out = filter_shard(out, out_shardings)
            return pack_output(out, held=True)

        def traced(dynamic: list[Any]) -> Any:
            count.record(name, flag, lambda: (treedef, mask, static, tuple(map(aval_of, dynamic))))
            # Traced once as it is, unless it calls a `compile_once` method: then again, with
            # independent calls of one such program rolled into loops (`roll.py`).
            return trace_maybe_rolled(run, dynamic)

        _named(traced, name)
        placed: list[Any] | None = None
        if in_shardings is not None:
            fn_def, args_def, kwargs_def = treedef.children()
            every = [None] * fn_def.num_leaves + _arg_shardings(in_shardings, args_def)
            placed = list(compress(every + [None] * kwargs_def.num_leaves, mask))
        if self._donate == "none":
            return jax.jit(traced) if placed is None else jax.jit(traced, in_shardings=(placed,))

        def donating(kept: list[Any], donated: list[Any]) -> Any:
            return traced(kept + donated)

        k = self._n_kept(treedef, mask)
        split = None if placed is None else (placed[:k], placed[k:])
        jitted = jax.jit(_named(donating, name), donate_argnums=1, in_shardings=split)
        quiet = self._donate in ("all", "all-except-first")
        return _Donating(jitted, k, quiet)

    def _n_kept(self, treedef: Any, mask: tuple[bool, ...]) -> int:
        """How many array leaves (at the front) are not donated: `fn`'s and the first
        positional argument's for the `-except-first` modes, else none."""
        if self._donate in ("all", "warn"):
            return 0
        fn_def, args_def, _ = treedef.children()
        n = fn_def.num_leaves
        if args_def.num_leaves and args_def.children():
            n += args_def.children()[0].num_leaves
        return sum(mask[:n])

    def lower(self, /, *args: P.args, **kwargs: P.kwargs) -> Lowered[P, R]:
        """Trace and lower for these arguments, for ahead-of-time compilation.

        Returns:
            A `Lowered` whose `.compile()` gives a callable taking arguments of the same
            structure, array shapes and static values.
        """
        leaves, treedef = _flatten((self._fn_tree, args, kwargs))
        key, mask, static = call_key(leaves, treedef)
        try:
            version = self._versions.get(key)
        except TypeError:
            self._raise_unhashable(args, kwargs)
            raise
        if version is None:
            key, version, _ = self._version_for(key, mask, static)
        else:  # the key `Compiled` checks calls against: copied as `JitCache` stores keys
            key = (snapshot_structure(key[0]), key[1], key[2])
        dynamic = list(compress(leaves, mask))
        if isinstance(version, _Donating):
            k: int | None = version.kept
            lowered_jax = version.jitted.lower(dynamic[: version.kept], dynamic[version.kept :])
        else:
            k = None
            lowered_jax = version.lower(dynamic)  # type: ignore[attr-defined]
        lowered = Lowered(lowered_jax, self, key, k)
        # What `save_compiled` records: the arguments as the trace saw them.
        lowered._signature = (treedef, mask, static, tuple(aval_of(x) for x in dynamic))
        return lowered


class Lowered(Generic[P, R]):
    """The result of `filter_jit(f).lower(*args)`: call `.compile()`; `.as_text()` shows it."""

    def __init__(self, lowered: Any, wrapper: JitWrapped[P, R], key: Key, k: int | None) -> None:
        self._lowered = lowered
        self._wrapper = wrapper
        self._key = key
        self._k = k
        self._signature: tuple[Any, ...] = ()

    def as_text(self) -> str:
        """The lowered program (StableHLO) as text."""
        return str(self._lowered.as_text())

    def compile(self, compiler_options: dict[str, Any] | None = None) -> Compiled[P, R]:
        """Compile, returning a callable with the wrapped function's signature.

        Arguments:
            compiler_options: XLA options for this compilation only (`jax.jit`'s
                `.lower(...).compile(compiler_options=...)`), e.g.
                `{"xla_cpu_experimental_ynn_fusion_type": ""}`.

        Returns:
            A `Compiled` taking arguments of the same structure, shapes and static values.
        """
        compiled = Compiled(
            self._lowered.compile(compiler_options), self._wrapper, self._key, self._k
        )
        compiled._signature = self._signature
        return compiled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lowered, name)


class Compiled(Generic[P, R]):
    """An ahead-of-time compiled `filter_jit` function, callable like the original."""

    def __init__(self, compiled: Any, wrapper: JitWrapped[P, R], key: Key, k: int | None) -> None:
        self._compiled = compiled
        self._wrapper = wrapper
        self._key = key
        self._k = k
        self._signature: tuple[Any, ...] = ()

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        wrapper = self._wrapper
        leaves, treedef = _flatten((wrapper._fn_tree, args, kwargs))
        key, mask, _ = call_key(leaves, treedef)
        if key != self._key:
            raise TypeError(
                f"This compiled version of {wrapper._name} was lowered for arguments with a "
                "different tree structure or different static (non-array) values. Call "
                "`.lower(...)` again with these arguments, or call the filter_jit function "
                "itself, which compiles as needed."
            )
        dynamic = list(compress(leaves, mask))
        k = self._k
        if k is None:
            return unpack_output(self._compiled(dynamic))  # type: ignore[no-any-return]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=UNUSED_DONATION)
            return unpack_output(self._compiled(dynamic[:k], dynamic[k:]))  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


@overload
def filter_jit(
    fun: Callable[P, R],
    *,
    donate: Donate = "none",
    explain_retraces: bool | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> JitWrapped[P, R]: ...


@overload
def filter_jit(
    fun: None = None,
    *,
    donate: Donate = "none",
    explain_retraces: bool | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> Callable[[Callable[P, R]], JitWrapped[P, R]]: ...


def filter_jit(
    fun: Callable[P, R] | None = None,
    *,
    donate: Donate = "none",
    explain_retraces: bool | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> JitWrapped[P, R] | Callable[[Callable[P, R]], JitWrapped[P, R]]:
    """Compile a function with `jax.jit`, tracing its arrays and treating everything else as static.

    JAX and NumPy arrays anywhere in the arguments (positional or keyword, nested in modules,
    lists, dicts) are traced. Every other leaf (Python numbers, strings, functions, ...) is
    static: it is hashed and compared, and a new value compiles a new version. Outputs may hold
    non-array leaves. The call returns as soon as the computation is dispatched, like `jax.jit`.

    `fun` may be a function, a `Module` (its arrays are traced like an argument), a bound method
    of a module (`filter_jit(model.loss)` traces `model`'s arrays), or a method decorated in a
    class body.

    Arguments:
        fun: the function to compile. Omit it to use `filter_jit(donate=...)` as a decorator.
        donate: which argument buffers XLA may reuse for outputs: `"all"`, `"all-except-first"`
            (keep the first positional argument, and the arrays of `fun` itself), `"warn"`
            and `"warn-except-first"` (the same, but JAX warns about buffers it could not
            reuse) or `"none"`. Donated arrays must not be used after the call.
        explain_retraces: log (logger `"treemod"`, level WARNING) which argument path changed,
            and how, whenever the function is traced again. `None` reads the environment
            variable `TREEMOD_EXPLAIN_RETRACES` (`1` turns it on).
        in_shardings: where the array arguments go (`jax.jit`'s `in_shardings`, for array
            leaves only): a `Sharding` for all, or a pytree prefix of the positional arguments
            (a tuple, one entry per argument; `None` leaves a part as it comes, e.g.
            `(tm.model_shardings(model, mesh, rules), batch_sharding)`). Keyword arguments
            and `fun`'s own arrays keep their shardings. As with `jax.jit`, an array committed
            to another sharding is an error (place it first: `tm.shard`, `tm.filter_shard`).
        out_shardings: a `Sharding` or a pytree prefix of the output, for its arrays.

    Returns:
        The compiled function, typed as `fun` (a type checker sees its parameters and result).
        It has `.lower(*args, **kwargs)` for ahead-of-time compilation and
        `.with_max_traces(n)`; `treemod.debug.get_num_traces` counts its traces.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> @tm.filter_jit
        ... def scale(x, factor, name):
        ...     return x * factor, name.upper()
        >>> scale(jnp.ones(2), 3.0, "double")
        (Array([3., 3.], dtype=float32), 'DOUBLE')
        >>> scale(jnp.zeros(2), 3.0, "double")[0]
        Array([0., 0.], dtype=float32)
        >>> tm.debug.get_num_traces(scale)
        1
    """
    if donate not in _DONATE_MODES:
        raise ValueError(f"filter_jit: donate must be one of {_DONATE_MODES}; got {donate!r}.")
    if fun is None:
        return lambda f: filter_jit(
            f,
            donate=donate,
            explain_retraces=explain_retraces,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
        )
    if not callable(fun):
        raise TypeError(
            f"filter_jit expects a callable (function, Module or bound method); got "
            f"{type(fun).__name__}. As a decorator with options, write "
            "`@filter_jit(donate=...)`."
        )
    return JitWrapped(fun, donate, explain_retraces, in_shardings, out_shardings)
