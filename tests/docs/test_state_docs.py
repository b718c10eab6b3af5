"""Run the code blocks of docs/concepts/state.md: treemod's, and each peer's when installed.

The markers are those of tests/test_docs_pages.py: `<!-- shared -->` (setup run everywhere),
`<!-- peer: NAME -->` (another framework's code, run on its own after the shared blocks) and
`<!-- skip -->`.
"""

import importlib.util
import pathlib
import re
import sys
import textwrap
import types
import warnings

import jax
import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "concepts" / "state.md"
_FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```\s*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*(skip|shared|peer:\s*[\w.]+)\s*-->\s*$")
_PEERS = {"equinox": "equinox", "flax.nnx": "flax", "flax.linen": "flax", "haiku": "haiku"}


def _blocks() -> list[tuple[str, int, str]]:
    """(kind, line, code) for each python block; kind is treemod, shared, skip or peer:NAME."""
    text = PAGE.read_text()
    found = []
    for match in _FENCE.finditer(text):
        if match.group(2) != "python":
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        kind = "treemod" if marker is None else re.sub(r"\s+", "", marker.group(1))
        line = text.count("\n", 0, match.start()) + 1
        found.append((kind, line, textwrap.dedent(match.group(3))))
    return found


def _run_all(kinds: set[str], name: str) -> None:
    module = types.ModuleType(name)  # a real module: dataclasses look their classes up in it
    sys.modules[name] = module
    try:
        for kind, line, code in _blocks():
            if kind in kinds:
                exec(
                    compile(code, f"docs/concepts/state.md:{line}", "exec", dont_inherit=True),
                    module.__dict__,
                )  # noqa: S102 - the documentation's own examples
    finally:
        del sys.modules[name]


def test_treemod_blocks_run() -> None:
    # Standard dtype promotion, as users have it (optax's Adam needs it); rank promotion still
    # raises and warnings are still errors.
    with jax.numpy_dtype_promotion("standard"):
        _run_all({"shared", "treemod"}, "docs_concepts_state")


@pytest.mark.parametrize("peer", sorted(_PEERS))
def test_peer_blocks_run(peer: str) -> None:
    module = _PEERS[peer]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed, so its blocks on the state page are not run")
    assert any(kind == f"peer:{peer}" for kind, _, _ in _blocks()), f"no {peer} block"
    with (
        warnings.catch_warnings(),
        jax.numpy_dtype_promotion("standard"),
        jax.numpy_rank_promotion("allow"),
    ):
        warnings.simplefilter("ignore")  # peers' own deprecations are not ours to fail on
        _run_all({"shared", f"peer:{peer}"}, f"docs_concepts_state_{peer.replace('.', '_')}")


def test_markers_are_known() -> None:
    for kind, line, _ in _blocks():
        assert kind in {"treemod", "shared", "skip"} or kind.removeprefix("peer:") in _PEERS, line
