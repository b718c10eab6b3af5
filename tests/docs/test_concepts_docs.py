"""The python blocks of docs/concepts/keys.md, scan.md and layouts.md run, in order, each page
in one namespace."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "concepts"


@pytest.mark.parametrize("page", ["keys.md", "scan.md", "layouts.md"])
def test_concepts_page_runs(page, capsys):
    text = (DOCS / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{page} has no python blocks"
    namespace: dict = {"__name__": f"docs_{page}"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{page}[block {i}]", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{page}: python block {i} failed: {e!r}\n{block}") from e
