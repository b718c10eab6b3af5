"""The one runner for the code blocks of the documentation pages (used by tests/docs/).

Every Markdown page under `docs/` is run, except those in `SKIP_PAGES` (each with its reason),
so a new page is tested as soon as it exists. On a page:

- ```` ```python ```` blocks run in page order, in one namespace per page, like a notebook. The
  namespace is a real, importable module (dataclasses and pickle look classes up in it).
- A ```` ```text ```` (or ```` ```output ````) block right after a python block is what that
  block prints, compared with doctest's rules: `...` matches anything, and runs of whitespace
  are equal.
- An HTML comment on the line just before a block changes what happens to it:
  `<!-- skip -->` never runs it (an illustrative fragment; before a text block: not an output);
  `<!-- shared -->` is setup that runs with treemod's blocks and before each peer's;
  `<!-- peer: NAME -->` is another library's code (NAME in `PEER_MODULES`), run with the page's
  shared blocks in a namespace of its own, when that library is installed.
  `<!-- multiprocess: N -->` is code for N processes joined by `jax.distributed`: not run here,
  but by tests/multiprocess/test_docs_page.py, through its harness.
- Other fences (bash, toml, ...) are not run.

Blocks run with JAX's standard dtype promotion, as users have it (optax's Adam mixes int32 step
counts with Python floats, which the suite's strict promotion rejects); rank promotion raises and
warnings are errors as in the rest of the suite. Peers' blocks run with their own warnings off
and rank promotion allowed: their internals are not held to treemod's test settings.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import re
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jax

DOCS = Path(__file__).resolve().parents[2] / "docs"

# Pages not run, with the reason. Keep it short: a page with code should be tested.
SKIP_PAGES: dict[str, str] = {}

# The library each `<!-- peer: NAME -->` marker needs installed.
PEER_MODULES = {
    "equinox": "equinox",
    "flax.nnx": "flax",
    "flax.linen": "flax",
    "haiku": "haiku",
    "torch": "torch",
}

_FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*(skip|shared|peer:\s*[\w.]+|multiprocess:\s*\d+)\s*-->\s*$")
_OUTPUT_LANGUAGES = ("text", "output")
_CHECKER = doctest.OutputChecker()
_CHECK_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass(frozen=True)
class Block:
    """One python block of a page and what it must print."""

    page: str  # relative to docs/, e.g. "concepts/saving.md"
    line: int  # of the opening fence
    kind: str  # "treemod", "shared", "skip" or "peer"
    peer: str | None
    code: str
    expected: str | None  # the text block right after it, if any

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


@dataclass
class PageRun:
    """What running a page left: its namespace and what each block printed, in order."""

    namespace: dict[str, object]
    printed: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.printed)


def pages() -> list[str]:
    """Every page under docs/ that has a python block, relative to docs/, minus `SKIP_PAGES`."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        page = path.relative_to(DOCS).as_posix()
        if page not in SKIP_PAGES and any(True for _ in blocks(page)):
            found.append(page)
    return found


def blocks(page: str) -> list[Block]:
    """The python blocks of `page`, in order, each with its marker and expected output."""
    text = (DOCS / page).read_text()
    fences = []
    for match in _FENCE.finditer(text):
        indent, language, body = match.groups()
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        label = re.sub(r"\s+", "", marker.group(1)) if marker else None
        line = text.count("\n", 0, match.start()) + 1
        fences.append((language, label, line, textwrap.dedent(body)))
    found = []
    for i, (language, label, line, body) in enumerate(fences):
        if language != "python":
            continue
        following = fences[i + 1] if i + 1 < len(fences) else None
        expected = None
        if following and following[0] in _OUTPUT_LANGUAGES and following[1] != "skip":
            expected = following[3]
        kind, peer = "treemod", None
        if label is not None and label.startswith("peer:"):
            kind, peer = "peer", label.removeprefix("peer:")
        elif label is not None:
            kind = label
        found.append(Block(page, line, kind, peer, body, expected))
    return found


def peers(page: str) -> list[str]:
    """The peer libraries whose code appears on `page`."""
    return sorted({b.peer for b in blocks(page) if b.peer is not None})


@contextlib.contextmanager
def _module_namespace(name: str) -> Iterator[dict[str, object]]:
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        yield module.__dict__
    finally:
        del sys.modules[name]


def _run_block(block: Block, namespace: dict[str, object]) -> str:
    # dont_inherit: this file's `from __future__ import annotations` must not leak into the page.
    code = compile(block.code, block.where, "exec", dont_inherit=True)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(code, namespace)  # noqa: S102 - the documentation's own examples
        jax.effects_barrier()  # `jax.debug.print` output of this block, not the next one's
    printed = buffer.getvalue()
    if block.expected is not None and not _CHECKER.check_output(
        block.expected, printed, _CHECK_FLAGS
    ):
        raise AssertionError(
            f"{block.where} printed something other than the text block after it\n"
            f"--- the page says:\n{block.expected}--- it printed:\n{printed}"
        )
    return printed


def run_page(page: str, peer: str | None = None) -> PageRun:
    """Run treemod's blocks of `page` (with its shared ones), or, given `peer`, that peer's."""
    wanted = {"shared", "treemod"} if peer is None else {"shared", "peer"}
    chosen = [
        b for b in blocks(page) if b.kind in wanted and (peer is None or b.peer in (None, peer))
    ]
    name = "docs_" + re.sub(r"\W", "_", page if peer is None else f"{page}_{peer}")
    with contextlib.ExitStack() as stack:
        namespace = stack.enter_context(_module_namespace(name))
        stack.enter_context(jax.numpy_dtype_promotion("standard"))
        if peer is not None:
            stack.enter_context(jax.numpy_rank_promotion("allow"))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        run = PageRun(namespace)
        for block in chosen:
            run.printed.append(_run_block(block, namespace))
    return run
