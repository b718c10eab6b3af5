"""Run the code of the "Shape checking" concepts page; a `text` block after a code block is the
output it must print."""

import contextlib
import io
import pathlib
import re

import pytest

from treemod._shapecheck.config import _GLOBAL

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "concepts" / "shape-checking.md"
_FENCE = re.compile(r"^```(python|text)\n(.*?)^```\s*$", re.M | re.S)


@pytest.fixture(autouse=True)
def _restore():
    saved = list(_GLOBAL)
    yield
    _GLOBAL[:] = saved


def _blocks() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for each python block, in order."""
    found = [(m.group(1), m.group(2)) for m in _FENCE.finditer(PAGE.read_text())]
    out: list[tuple[str, str | None]] = []
    for i, (kind, body) in enumerate(found):
        if kind != "python":
            continue
        following = found[i + 1] if i + 1 < len(found) else None
        out.append((body, following[1] if following and following[0] == "text" else None))
    return out


def test_page_has_code():
    assert len(_blocks()) >= 6


def test_page_code_runs_and_prints_what_the_page_says():
    namespace: dict = {"__name__": "shape_checking_page"}
    for i, (code, expected) in enumerate(_blocks()):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, f"{PAGE.name} block {i}", "exec"), namespace)
        if expected is not None:
            assert buffer.getvalue().strip() == expected.strip(), f"block {i}"
