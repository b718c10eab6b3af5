"""Other libraries' code on the documentation pages runs where the library is installed
(tests/docs/pages.py)."""

from __future__ import annotations

import importlib.util

import pages
import pytest


def _peer_cases() -> list[tuple[str, str]]:
    return [(page, peer) for page in pages.pages() for peer in pages.peers(page)]


@pytest.mark.parametrize(("page", "peer"), _peer_cases())
def test_peer_blocks_run(page: str, peer: str) -> None:
    """Other libraries' code on the pages is real: run it where the library is installed."""
    module = pages.PEER_MODULES[peer]
    if importlib.util.find_spec(module) is None:  # an optional peer, not a treemod dependency
        pytest.skip(f"{module} is not installed (pip install {module}): its blocks are not run")
    pages.run_page(page, peer)
