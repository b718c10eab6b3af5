"""`CompileReport`, its rows, and the table and advice it prints."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

__all__ = ["CompileReport", "PathCost", "ProgramCost", "advice"]

_INDEX = re.compile(r"\[\d+\]")


@dataclasses.dataclass(frozen=True)
class PathCost:
    """What tracing and lowering cost at one module path (one row of a `CompileReport`).

    `trace_s`, `eqns` and `hlo_chars` are inclusive (the modules it calls count too), the
    `self_` ones exclusive. The first row is the function itself (type `"function"`).

    Attributes:
        path: the module's key path in the arguments, rooted at its parameter's name
            (`model.layers[3].mlp`; `self` for the function's own module).
        type_name: the module's class name.
        calls: how many times the trace called it.
        trace_s: seconds spent in its calls while tracing.
        self_trace_s: the same, less the time of the modules it called.
        eqns: jaxpr equations emitted under it, nested programs' bodies counted at each call.
        self_eqns: the same, less those of the modules it called.
        hlo_chars: characters of StableHLO lowered under it (a shared function counts once).
        self_hlo_chars: the same, less those of the modules it called.
        once_uses: calls of `compile_once` programs under it.
    """

    path: str
    type_name: str
    calls: int
    trace_s: float
    self_trace_s: float
    eqns: int
    self_eqns: int
    hlo_chars: int
    self_hlo_chars: int
    once_uses: int


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """A nested program (an inner `jax.jit` or `filter_jit`): traced once, used at each site.

    Attributes:
        name: the program's name (the jitted function's).
        inputs: its input types (`f32[8,4] f32[8]`): a function traced for several input
            types or static arguments gives several programs of one name.
        uses: its call sites in the inlined program (how many calls share this one trace).
        eqns: equations in its body (nested programs included).
        compiled_once: whether it is a `compile_once` program.
        callers: the paths it is called under, with how many calls each.
    """

    name: str
    inputs: str
    uses: int
    eqns: int
    compiled_once: bool
    callers: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What compiling a function costs, per module path: `print` it, or read `.rows`.

    Attributes:
        function: the function's name.
        rows: one `PathCost` per module path the trace used, in argument order (the function
            first).
        programs: one `ProgramCost` per distinct nested program.
        trace_s: seconds to trace the function (jaxpr).
        lower_s: seconds to lower the jaxpr to StableHLO.
        compile_s: seconds XLA took to compile it (`compile=True`), else `None`.
        eqns: equations in the jaxpr, nested programs' bodies counted at each call.
        hlo_chars: characters of the lowered StableHLO (`lowered.as_text()`).
        hlo_functions: functions in it (`main` and one per distinct lowered nested program).
        scan_loops: loops (`stablehlo.while`) in it: `lax.scan`s, `fori_loop`s and the loops
            that `compile_once` rolls repeats into.
        fusions: fusions in the compiled program (`compile=True`), else `None`.
        advice: what to change, for the most expensive repeated modules.
    """

    function: str
    rows: tuple[PathCost, ...]
    programs: tuple[ProgramCost, ...]
    trace_s: float
    lower_s: float
    compile_s: float | None
    eqns: int
    hlo_chars: int
    hlo_functions: int
    scan_loops: int
    fusions: int | None
    advice: tuple[str, ...]

    def row(self, path: str) -> PathCost:
        """The row of `path` (as the table shows it).

        Raises:
            KeyError: no module at `path` was used; the message lists the paths there are.
        """
        for r in self.rows:
            if r.path == path:
                return r
        known = ", ".join(r.path for r in self.rows[:12])
        more = "" if len(self.rows) <= 12 else f", ... ({len(self.rows)} in all)"
        raise KeyError(
            f"compile report of {self.function}: no row for {path!r}; rows: {known}{more}"
        )

    def table(self, top: int = 20) -> str:
        """The report as text: totals, the `top` most expensive paths, nested programs, advice.

        Arguments:
            top: how many paths (by inclusive trace time) and programs (by equations inlined)
                to show.

        Returns:
            The text `print(report)` shows.
        """
        out = [self._summary(), ""]
        rows = sorted(self.rows, key=lambda r: (-r.trace_s, -r.eqns))
        out += _grid(
            ("path", "type", "calls", "trace ms", "self ms", "eqns", "self eqns", "HLO kB"),
            [
                (
                    r.path,
                    r.type_name,
                    str(r.calls),
                    f"{1e3 * r.trace_s:.1f}",
                    f"{1e3 * r.self_trace_s:.1f}",
                    str(r.eqns),
                    str(r.self_eqns),
                    f"{r.hlo_chars / 1e3:.1f}",
                )
                for r in rows[:top]
            ],
            "llrrrrrr",
        )
        if len(rows) > top:
            out.append(f"... {len(rows) - top} more paths (report.rows has them all)")
        if self.programs:
            programs = sorted(self.programs, key=lambda p: (-p.uses * p.eqns, p.name))
            out += ["", "nested programs (traced once, reused at each call site):"]
            out += _grid(
                ("program", "inputs", "uses", "eqns", "kind", "called from"),
                [
                    (
                        p.name,
                        p.inputs if len(p.inputs) <= 32 else p.inputs[:29] + "...",
                        str(p.uses),
                        str(p.eqns),
                        "compiled once" if p.compiled_once else "shared trace",
                        _callers(p.callers),
                    )
                    for p in programs[:top]
                ],
                "llrrll",
            )
            if len(programs) > top:
                out.append(f"... {len(programs) - top} more (report.programs has them all)")
        if self.advice:
            out += ["", "what to do:"] + [f"- {a}" for a in self.advice]
        return "\n".join(out)

    def _summary(self) -> str:
        compiled = ""
        if self.compile_s is not None:
            compiled = f", XLA compile {1e3 * self.compile_s:.1f} ms ({self.fusions} fusions)"
        uses = sum(p.uses for p in self.programs)
        return (
            f"compile report of {self.function}: trace {1e3 * self.trace_s:.1f} ms, "
            f"lowering {1e3 * self.lower_s:.1f} ms{compiled}\n"
            f"{self.eqns} equations, {self.hlo_chars / 1e3:.1f} kB of StableHLO in "
            f"{self.hlo_functions} function{'s' * (self.hlo_functions != 1)}, "
            f"{len(self.programs)} nested program{'s' * (len(self.programs) != 1)} at {uses} "
            f"call site{'s' * (uses != 1)}, {self.scan_loops} "
            f"loop{'s' * (self.scan_loops != 1)}"
        )

    def __str__(self) -> str:
        return self.table()


def _grid(head: Sequence[str], body: Sequence[Sequence[str]], left: str) -> list[str]:
    """Columns padded to their widths: those marked `l` in `left` left-aligned, the others
    (numbers) right-aligned."""
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
    lines = []
    for row in (head, *body):
        cells = [
            c.ljust(w) if left[i] == "l" else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _callers(callers: tuple[tuple[str, int], ...]) -> str:
    """`model.layers[*] (12)`: the calling paths, grouped by their pattern over indices."""
    grouped: Counter[str] = Counter()
    for path, n in callers:
        grouped[_INDEX.sub("[*]", path)] += n
    parts = [p if n == 1 else f"{p} ({n})" for p, n in grouped.most_common(3)]
    if len(grouped) > 3:
        parts.append(f"... {len(grouped) - 3} more")
    return ", ".join(parts)


def _chain(members: Sequence[str], reads: Mapping[str, set[str]]) -> bool:
    """Whether every two of the calls are ordered: one reads the other's output."""
    return all(
        a in reads.get(b, ()) or b in reads.get(a, ())
        for i, a in enumerate(members)
        for b in members[i + 1 :]
    )


def advice(
    rows: Sequence[PathCost],
    signatures: Mapping[str, Hashable],
    reads: Mapping[str, set[str]] | None = None,
    limit: int = 3,
) -> tuple[str, ...]:
    """Hints for the most expensive repeats, traced again at each use: identical sibling
    modules (`layers[0]` to `layers[11]`, same `signatures[path]`: structure, static values,
    array shapes), or one module called many times.

    `compile_once` is advised only for siblings that do not all read each other's outputs
    (`reads[path]`: the paths whose outputs reach it), the calls it rolls into loops; for a
    chain it would only add nested programs (measured on a UNet's residual chains: compile
    2.1x, step 2.5x slower), so a chain is pointed to `nn.Stack`."""
    reads = reads or {}
    root = rows[0]
    groups: dict[tuple[str, str, Hashable], list[PathCost]] = {}
    for r in rows[1:]:
        pattern = _INDEX.sub("[*]", r.path)
        if pattern != r.path:
            groups.setdefault((pattern, r.type_name, signatures[r.path]), []).append(r)
        elif r.calls > 1:
            groups[(r.path, r.type_name, None)] = [r]
    found = []
    paths: dict[str, list[str]] = {}
    for (pattern, type_name, _), members in groups.items():
        paths[pattern] = [m.path for m in members]
        uses = sum(m.calls for m in members)
        if uses < 2 or sum(m.once_uses for m in members) >= uses:
            continue  # not repeated, or already compiled once
        share = sum(m.trace_s for m in members) / root.trace_s if root.trace_s else 0.0
        eqn_share = sum(m.eqns for m in members) / root.eqns if root.eqns else 0.0
        found.append((share, eqn_share, pattern, type_name, len(members), uses))
    found.sort(reverse=True)
    taken: list[str] = []
    hints = []
    for share, eqn_share, pattern, type_name, n, uses in found:
        if any(pattern.startswith((t + ".", t + "[")) for t in taken) or share < 0.05:
            continue  # inside a repeat already advised on, or cheap
        taken.append(pattern)
        what = f"{n} {type_name}s" if n > 1 else f"one {type_name} called {uses} times"
        stack = "hold the layers in nn.Stack (one lax.scan)" if n > 1 else "call it in a lax.scan"
        cost = (
            f"{pattern}: {what} take {share:.0%} of the trace time and {eqn_share:.0%} of the "
            f"equations, traced at each use"
        )
        if n > 1 and _chain(paths[pattern], reads):
            hints.append(
                f"{cost}, in a chain (each reads the one before): to trace and compile one, "
                f"{stack}. tm.compile_once would not help here: it rolls only calls that do not "
                "read each other's outputs, and a chain of nested programs compiles slower."
            )
            continue
        once = f"decorate {type_name}.__call__ with tm.compile_once, or "
        hints.append(f"{cost}: to trace and compile one, {once}{stack}.")
        if len(hints) == limit:
            break
    return tuple(hints)
