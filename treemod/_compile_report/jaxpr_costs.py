"""Equations per module path, and the nested programs of a traced function.

A nested `jax.jit` (a `filter_jit` inside the function, the cores of `treemod.nn`'s layers) is
one `jit` equation holding its callee's jaxpr. JAX traces a callee once per function and input
signature and hands every call site the same jaxpr object, so the callees grouped by identity
are the traced programs, and their number of call sites is their reuse. Counts are inlined:
each call site counts its callee's equations, as in the program XLA compiles (it inlines every
call), so a path's count equals that of tracing the module alone.

A callee's equations carry name stacks relative to the callee (JAX traces it once for all
call sites), so they count toward the paths of the equation that calls them, plus any path
scopes of their own (a module with a path called inside a nested trace).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from treemod._compile_report.names import ScopeReader
from treemod._format.describe import describe_array
from treemod._private_apis import called_program, sub_jaxprs

__all__ = ["JaxprCosts", "ProgramUse", "jaxpr_costs"]


@dataclasses.dataclass
class ProgramUse:
    """One traced nested program: its name, call sites (inlined), body size and callers."""

    name: str
    inputs: str
    uses: int = 0
    eqns: int = 0
    callers: Counter[str] = dataclasses.field(default_factory=Counter)


@dataclasses.dataclass
class JaxprCosts:
    """Equations per path (inclusive and exclusive), the programs, and loops."""

    eqns: Counter[str]
    self_eqns: Counter[str]
    total: int
    programs: list[ProgramUse]
    scans: int
    once_uses: Counter[str]
    # path -> the paths whose outputs its equations read (transitively), in the top-level
    # program: calls that read each other form a chain, which `compile_once` cannot roll.
    reads: dict[str, set[str]] = dataclasses.field(default_factory=dict)


def _inputs(jaxpr: Any) -> str:
    """The callee's input types (`f32[8,4] f32[8]`): what tells two traces of one name apart."""
    avals: list[Any] = [getattr(v, "aval", None) for v in jaxpr.invars]
    return " ".join(
        describe_array(a.shape, a.dtype) if hasattr(a, "shape") else str(a) for a in avals
    )


def _size(jaxpr: Any, memo: dict[int, int]) -> int:
    """Equations of `jaxpr`, nested ones included (memoised per jaxpr object)."""
    found = memo.get(id(jaxpr))
    if found is None:
        found = 0
        for eqn in jaxpr.eqns:
            found += 1
            for sub in sub_jaxprs(eqn.params):
                found += _size(sub, memo)
        memo[id(jaxpr)] = found
    return found


def jaxpr_costs(closed: Any, read: ScopeReader, root: str, marker: str) -> JaxprCosts:
    """Walk a traced function's jaxpr, attributing each equation to the module paths whose
    scopes it ran under (`read` finds them; none: `root`)."""
    costs = JaxprCosts(Counter(), Counter(), 0, [], 0, Counter())
    _dataflow(closed.jaxpr, read, costs.reads)
    programs: dict[int, ProgramUse] = {}
    memo: dict[int, int] = {}
    # (jaxpr, the paths of the equation that holds it), walked without recursion: deep models
    # nest programs deeply.
    todo: list[tuple[Any, tuple[str, ...]]] = [(closed.jaxpr, ())]
    while todo:
        jaxpr, outer = todo.pop()
        for eqn in jaxpr.eqns:
            chain = outer
            for path in read(str(eqn.source_info.name_stack)):
                if path not in chain:
                    chain = (*chain, path)
            costs.total += 1
            costs.self_eqns[chain[-1] if chain else root] += 1
            costs.eqns[root] += 1
            for path in chain:
                costs.eqns[path] += 1
            name = eqn.primitive.name
            if name == "scan":
                costs.scans += 1
            call = called_program(eqn)
            if call is not None:
                callee = call[0].jaxpr
                use = programs.get(id(callee))
                if use is None:
                    label = call[1]
                    use = programs[id(callee)] = ProgramUse(
                        label, _inputs(callee), eqns=_size(callee, memo)
                    )
                use.uses += 1
                use.callers[chain[-1] if chain else root] += 1
                if marker in use.name:
                    for path in (root, *chain):
                        costs.once_uses[path] += 1
            todo.extend((sub, chain) for sub in sub_jaxprs(eqn.params))
    costs.programs = list(programs.values())
    return costs


def _dataflow(jaxpr: Any, read: ScopeReader, reads: dict[str, set[str]]) -> None:
    """Fill `reads`: for each path, the other paths whose outputs flow into its equations."""
    made_by: dict[Any, frozenset[str]] = {}  # variable -> the paths it was computed from
    for eqn in jaxpr.eqns:
        stack = str(eqn.source_info.name_stack)
        if "transpose(" in stack:
            # The backward pass reads every forward value: only the forward pass tells a chain
            # of calls from calls side by side.
            continue
        chain = frozenset(read(stack))
        inputs: frozenset[str] = frozenset()
        for v in eqn.invars:
            if not hasattr(v, "val"):  # a literal carries no path
                inputs |= made_by.get(v, frozenset())
        for path in chain:
            reads.setdefault(path, set()).update(inputs - chain)
        for v in eqn.outvars:
            made_by[v] = inputs | chain
