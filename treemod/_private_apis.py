"""Every private JAX and jaxtyping API that treemod uses, in one place (layer 1).

A private name can move or change in any release of its library, so no other file of treemod
imports from `jax._src` or `jaxtyping._storage`: they import from here. Each name says what it
is, why treemod needs it (what the public API lacks) and since which version it exists where
it is imported from, and where a JAX release moved or changed it, the import or accessor for each
version. `make test` runs `tests/project/test_private_apis.py` on both ends of the supported
range (jax 0.10.2 on Python 3.11 and jax 0.12 on Python 3.13): it checks each name against the
installed libraries' public API and behaviour, so an upgrade that moves or changes one fails
there, naming it.

Reading traced programs (`_transforms/roll.py`, `_compile_report/`) relies on jaxpr internals
too: which primitive is a nested call and which parameter holds its program. Those assumptions
are here as well (`CALL_PRIMITIVES`, `called_program`, `sub_jaxprs`).

Importing this module costs nothing beyond `import jax`: the `jax._src` modules are loaded by
JAX itself, and jaxtyping's names are looked up at their first use (`__getattr__` below), as
`import treemod` does not import jaxtyping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax  # noqa: F401  (loads the jax._src modules below)

# `source_info_util` (jax._src, since JAX 0.2): `_transforms/roll.py` re-emits a traced
# program's equations one by one, as `jax.core.eval_jaxpr` does, keeping each equation's name
# stack and source location (the compile report and XLA's metadata read them).
from jax._src import source_info_util as _source_info_util

# `Primitive`, `Literal`, `find_top_trace`, `eval_jaxpr` (jax._src.core, there
# since JAX 0.4.2; `jax.extend.core` re-exports all but `eval_jaxpr`, and
# `tests/project/test_private_apis.py` checks that each is the public object). They are imported
# from where they live because importing `jax.extend` imports every one of its submodules (tens
# of milliseconds at `import treemod`).
# - `Primitive`: `unvmap_any`'s primitive (`_transforms/unvmap.py`), batched by hand.
# - `find_top_trace`: the innermost trace of the primals, so `filter_jvp` can tell its own
#   tracers from an enclosing transform's (no public equivalent).
# - `Literal`: a constant operand of an equation (`_transforms/roll.py`).
# - `eval_jaxpr`: run a traced program with given constants (`filter_closure_convert`, rolling).
from jax._src.core import Literal, Primitive, eval_jaxpr, find_top_trace

# `ClosedJaxpr`: a traced program with its constants, what `jax.make_jaxpr` returns and what a
# `jit` equation holds. JAX 0.12 merged it into `Jaxpr` (which carries `consts`, and whose
# `.jaxpr` is itself); `jax.extend.core.ClosedJaxpr` names the class on every version.
try:
    from jax._src.core import ClosedJaxpr  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # JAX >= 0.12
    from jax._src.core import Jaxpr as ClosedJaxpr

# `_convert_element_type(x, weak_type=True)` (jax._src.lax.lax, there before JAX 0.4.1): make an
# array weakly typed again. `load` restores a saved weakly typed scalar with it; the public
# `lax.convert_element_type` always returns a strongly typed array.
from jax._src.lax.lax import _convert_element_type as convert_element_type

if TYPE_CHECKING:
    # Shape memos of jaxtyping's checks (jaxtyping._storage, there since jaxtyping 0.2.24): the
    # dimension bindings of the check running now. treemod's checker pushes one per checked
    # call and reads it to name the dimension that disagreed; jaxtyping has no public API for it.
    from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

__all__ = [
    "CALL_PRIMITIVES",
    "DEBUG_CALLBACK_LOGGER",
    "ClosedJaxpr",
    "Primitive",
    "convert_element_type",
    "eval_jaxpr",
    "find_top_trace",
    "get_shape_memo",
    "bind_equation",
    "called_program",
    "eqn_context",
    "Literal",
    "sub_jaxprs",
    "opaque_trace_state",
    "pop_shape_memo",
    "push_shape_memo",
    "reset_compilation_cache",
    "trace_state_clean",
]

# The logger of the module that runs `jax.debug.callback`'s callbacks (jax._src.debugging; it
# logs "jax.debug.callback failed" with the exception since JAX 0.4.27). `error_if` filters out
# the record of its own failing checks, whose error is raised to the caller anyway.
DEBUG_CALLBACK_LOGGER = "jax._src.debugging"

# `trace_state_clean()` (jax._src.core, there since JAX 0.4.2): whether no transform is tracing.
# An eager layer call then runs one compiled program instead of op by op (`nn/_batching.py`);
# the public API has no cheap test for "not under any trace". Without it, the nested path.
try:
    from jax._src.core import trace_state_clean
except ImportError:  # pragma: no cover - a JAX that moved it

    def trace_state_clean() -> bool:
        return False


# `get_opaque_trace_state` (jax._src.core, since JAX 0.4.34): see `opaque_trace_state`.
try:
    from jax._src.core import get_opaque_trace_state as _get_opaque_trace_state
except ImportError:  # pragma: no cover - a JAX that moved it
    _get_opaque_trace_state = None  # type: ignore[assignment]


def opaque_trace_state() -> Any:
    """An opaque token for the JAX trace now running (`None` if this JAX cannot say).

    `stateful` compares tokens to refuse a state update recorded under one transform and read
    under another; the public API has no token for "the trace now running".
    """
    if _get_opaque_trace_state is None:  # pragma: no cover
        return None
    try:
        return _get_opaque_trace_state(convention="treemod")
    except Exception:  # pragma: no cover - changed: the nested-transform check is skipped
        return None


@contextlib.contextmanager
def eqn_context(eqn: Any) -> Iterator[None]:
    """The context `jax.core.eval_jaxpr` binds an equation under: its name stack, source
    location and context managers (JAX 0.4.36+: `eqn.ctx.manager`)."""
    name_stack = _source_info_util.current_name_stack() + eqn.source_info.name_stack
    user = _source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)
    with user, eqn.ctx.manager:
        yield


def bind_equation(eqn: Any, invals: list[Any]) -> list[Any]:
    """Bind one traced equation's primitive to `invals` as `jax.core.eval_jaxpr` does.

    `get_bind_params` returns the parameters alone since JAX 0.7 and `(subfuns, params)` before.
    """
    got = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = ([], got) if isinstance(got, dict) else got
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


# The primitive of a nested `jax.jit` call: `jit` since JAX 0.7 (`pjit` before). Its
# parameters hold the callee as `jaxpr` (a `ClosedJaxpr`) and its name as `name`.
CALL_PRIMITIVES = ("jit", "pjit")


def called_program(eqn: Any) -> tuple[Any, str] | None:
    """`(program, name)` if `eqn` calls a nested `jax.jit` program, else `None`.

    `program` is the callee as a `ClosedJaxpr` (its equations: `program.jaxpr.eqns`; JAX 0.12's
    merged `Jaxpr` is its own `.jaxpr`); one traced function gives every call site the same
    program object, so identity tells programs apart.
    """
    if eqn.primitive.name not in CALL_PRIMITIVES:
        return None
    program = eqn.params.get("jaxpr")
    if not isinstance(program, ClosedJaxpr):
        return None
    return program, str(eqn.params.get("name", eqn.primitive.name))


def sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The open jaxprs an equation's parameters hold (a callee, a loop body, a `cond`'s
    branches), each once."""
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, ClosedJaxpr):
                yield item.jaxpr
            elif hasattr(item, "eqns") and hasattr(item, "invars"):
                yield item


def reset_compilation_cache() -> None:
    """Make JAX's persistent compilation cache re-read its directory setting.

    `jax._src.compilation_cache.reset_cache` (since JAX 0.4.9): `enable_compile_cache` calls
    it so that a new directory takes effect even after something was compiled; setting the
    config options alone does not re-open the cache. A JAX without it keeps the old one.
    """
    try:
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - older or newer JAX
        pass


_JAXTYPING = {"get_shape_memo", "pop_shape_memo", "push_shape_memo"}


def __getattr__(name: str) -> Any:
    if name in _JAXTYPING:
        from jaxtyping import _storage

        value = globals()[name] = getattr(_storage, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
