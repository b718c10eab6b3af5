"""StableHLO characters per module path, read from `lowered.as_text(debug_info=True)`.

Every operation's location names the scopes it was traced under
(`"jit(loss)/model/model.mlp/dot_general"`, through `#locN` aliases, call sites and fused
locations); an operation counts toward those paths. A nested program is lowered once, as a
private function, whatever its number of call sites: its lines count once, toward the paths
of the first call that reaches it (in the text's order). An operation's size is its line
without locations, which is how `lowered.as_text()` prints it.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from treemod._compile_report.names import ScopeReader

__all__ = ["HloCosts", "hlo_costs"]

_LOC_DEF = re.compile(r"^(#loc\d*) = (loc\(.*\))\s*$")
_FUNC = re.compile(r'^\s*func\.func (?:public |private )?@("(?:[^"\\]|\\.)*"|[\w.$-]+)')
_CALL = re.compile(r'\bcall @("(?:[^"\\]|\\.)*"|[\w.$-]+)')
_ESCAPE = re.compile(rb"\\([0-9A-Fa-f]{2})")


@dataclasses.dataclass
class HloCosts:
    """Characters per path (inclusive and exclusive), per function, and loops."""

    chars: Counter[str]
    self_chars: Counter[str]
    functions: dict[str, int]
    whiles: int


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), text.encode())
    return raw.decode("utf-8", "replace")


def _string_end(text: str, start: int) -> int:
    """The index after the string literal opening at `text[start]`."""
    i = start + 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _close(text: str, start: int) -> int:
    """The index after the bracket that closes the one at `text[start]` (strings skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            continue
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets and strings."""
    parts, depth, last, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            continue
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[last:i])
            last = i = i + len(sep)
            continue
        i += 1
    parts.append(text[last:])
    return [p.strip() for p in parts]


class _Locations:
    """Resolves a location to the name it carries (a NameLoc's string), memoised per alias."""

    def __init__(self, defs: dict[str, str]) -> None:
        self.defs = defs
        self.memo: dict[str, str | None] = {}

    def name(self, loc: str) -> str | None:
        """`loc` is `#locN`, `loc(...)`, or what `loc(...)` holds."""
        loc = loc.strip()
        if loc.startswith("#"):
            if loc not in self.memo:
                self.memo[loc] = None  # a cycle (none in valid IR) resolves to nothing
                self.memo[loc] = self.name(self.defs.get(loc, "unknown"))
            return self.memo[loc]
        if loc.startswith("loc(") and loc.endswith(")"):
            return self.name(loc[4:-1])
        if loc.startswith('"'):
            end = _string_end(loc, 0)
            if loc[end : end + 1] == ":":  # "file":line:col
                return None
            return _unescape(loc[1 : end - 1])
        if loc.startswith("callsite(") and loc.endswith(")"):
            return self.name(_split_top(loc[9:-1], " at ")[0])
        if loc.startswith("fused"):
            start = loc.find("[", _close(loc, 5) if loc[5:6] == "<" else 5)
            for part in _split_top(loc[start + 1 : -1], ","):
                found = self.name(part)
                if found is not None:
                    return found
        return None


def _strip_locs(line: str) -> tuple[str, str | None]:
    """The line without its ` loc(...)` parts, and the last of them (the operation's own)."""
    last = None
    while (i := line.rfind("loc(")) >= 0 and (i == 0 or not line[i - 1].isalnum()):
        end = _close(line, i + 3)
        if last is None:
            last = line[i:end]
        line = line[:i].rstrip() + line[end:]
    return line, last


def hlo_costs(text: str, read: ScopeReader, root: str) -> HloCosts:
    """Attribute the characters of a lowered program (printed with locations) to paths."""
    defs: dict[str, str] = {}
    functions: dict[str, list[str]] = {}
    order: list[str] = []
    outside: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        m = _LOC_DEF.match(line)
        if m is not None:
            defs[m.group(1)] = m.group(2)
            continue
        f = _FUNC.match(line)
        if f is not None:
            current = functions[f.group(1)] = []
            order.append(f.group(1))
        (outside if current is None else current).append(line)
        if current is not None and line.startswith("  }"):  # a function's closing line
            current = None
    locations = _Locations(defs)
    costs = HloCosts(Counter(), Counter(), {}, 0)

    def add(line: str, base: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
        stripped, loc = _strip_locs(line)
        chain = base
        name = None if loc is None else locations.name(loc)
        if name is not None:
            for path in read(name):
                if path not in chain:
                    chain = (*chain, path)
        size = len(stripped) + 1
        costs.self_chars[chain[-1] if chain else root] += size
        costs.chars[root] += size
        for path in chain:
            costs.chars[path] += size
        if "stablehlo.while" in stripped:
            costs.whiles += 1
        return chain, size

    visited: set[str] = set()

    def visit(function: str, base: tuple[str, ...]) -> None:
        visited.add(function)
        own = 0
        for line in functions[function]:
            chain, size = add(line, base)
            own += size
            for callee in _CALL.findall(line):
                if callee in functions and callee not in visited:
                    visit(callee, chain)
        costs.functions[function] = own

    for line in outside:
        add(line, ())
    for function in order:  # `main` first, then those it does not reach
        if function not in visited:
            visit(function, ())
    return costs
