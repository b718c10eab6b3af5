"""Run the Python code blocks of the prose pages (home, getting started, migrating, FAQ).

Each page's ```` ```python ```` blocks run in order in one namespace, like a notebook, with rank
promotion raising and warnings as errors (dtype promotion is JAX's standard one, as users have it:
optax's Adam mixes int32 step counts with Python floats, which strict promotion rejects).
An HTML comment on the line before a block changes what happens to it:

- `<!-- skip -->`: never run (illustrative fragments).
- `<!-- peer: NAME -->`: another framework's code (NAME is `equinox`, `flax.nnx`, `flax.linen`,
  `haiku` or `torch`). Not run with the treemod blocks; `test_peer_blocks` runs each peer's blocks
  in a namespace of their own, after the page's `shared` blocks, when that framework is installed
  (and skips, saying so, when it is not).
- `<!-- shared -->`: setup that runs in the treemod namespace and in every peer namespace.
"""

from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import re
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = ["index.md", "getting-started.md", "migrating.md", "faq.md"]

_FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```\s*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*(skip|shared|peer:\s*[\w.]+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str  # "treemod", "shared", "skip" or "peer"
    peer: str | None
    code: str


def _blocks(page: str) -> Iterator[Block]:
    text = (DOCS / page).read_text()
    for match in _FENCE.finditer(text):
        _indent, language, body = match.groups()
        if language != "python":
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        kind, peer = "treemod", None
        if marker is not None:
            label = marker.group(1)
            if label.startswith("peer:"):
                kind, peer = "peer", label.split(":", 1)[1].strip()
            else:
                kind = label
        line = text.count("\n", 0, match.start()) + 1
        yield Block(page, line, kind, peer, textwrap.dedent(body))


def _run(block: Block, namespace: dict) -> None:
    # dont_inherit: this file's `from __future__ import annotations` must not leak into the page.
    code = compile(block.code, f"docs/{block.page}:{block.line}", "exec", dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the documentation's own examples


@contextlib.contextmanager
def _module_namespace(name: str) -> Iterator[dict]:
    """A real, importable module to run blocks in (dataclasses and pickle look classes up)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        yield module.__dict__
    finally:
        del sys.modules[name]


def _module_name(*parts: str) -> str:
    return "docs_" + "_".join(re.sub(r"\W", "_", p) for p in parts)


@pytest.mark.parametrize("page", PAGES)
def test_page_blocks_run(page: str) -> None:
    blocks = [b for b in _blocks(page) if b.kind in ("treemod", "shared")]
    assert blocks, f"docs/{page} has no runnable python block"
    # Standard dtype promotion, as users have it: optax's own updates (Adam's bias correction)
    # mix int32 step counts with Python floats, which strict promotion rejects. Rank promotion
    # still raises and warnings are still errors.
    with _module_namespace(_module_name(page)) as namespace, jax.numpy_dtype_promotion("standard"):
        for block in blocks:
            _run(block, namespace)


def _peer_cases() -> list[tuple[str, str]]:
    return sorted({(b.page, b.peer) for p in PAGES for b in _blocks(p) if b.peer is not None})


_PEER_MODULES = {
    "equinox": "equinox",
    "flax.nnx": "flax",
    "flax.linen": "flax",
    "haiku": "haiku",
    "torch": "torch",
}


@pytest.mark.parametrize(("page", "peer"), _peer_cases())
def test_peer_blocks(page: str, peer: str) -> None:
    """Other frameworks' code on the pages is real: run it where the framework is installed."""
    module = _PEER_MODULES[peer]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install {module}) so its blocks are not run")
    blocks = list(_blocks(page))
    # Peers' own internals are not held to treemod's strict test settings.
    with (
        _module_namespace(_module_name(page, peer)) as namespace,
        warnings.catch_warnings(),
        jax.numpy_dtype_promotion("standard"),
        jax.numpy_rank_promotion("allow"),
    ):
        warnings.simplefilter("ignore")
        for block in blocks:
            if block.kind == "shared" or block.peer == peer:
                _run(block, namespace)


def test_markers_are_known() -> None:
    for page in PAGES:
        for block in _blocks(page):
            if block.peer is not None:
                assert block.peer in _PEER_MODULES, f"docs/{page}:{block.line}: unknown peer"
