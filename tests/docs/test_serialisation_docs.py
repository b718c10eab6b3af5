"""The python blocks of docs/concepts/saving.md run, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re
import sys
import textwrap
import types

import jax
import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "concepts" / "saving.md"
_FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.M | re.S)


def test_saving_page_blocks_run() -> None:
    pytest.importorskip("optax")
    text = PAGE.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if "<!-- skip -->" not in before:
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((line, textwrap.dedent(match.group(1))))
    assert len(blocks) >= 5
    module = types.ModuleType("docs_saving")  # a real module, for dataclasses' lookups
    sys.modules[module.__name__] = module
    try:
        # optax's Adam mixes its int32 step count with floats, which strict promotion refuses.
        with jax.numpy_dtype_promotion("standard"):
            for line, code in blocks:
                exec(
                    compile(code, f"docs/concepts/saving.md:{line}", "exec", dont_inherit=True),
                    module.__dict__,
                )  # noqa: S102
    finally:
        del sys.modules[module.__name__]
