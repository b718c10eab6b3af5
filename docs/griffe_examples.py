"""A Griffe extension for treemod's API reference: examples render as code, not quotes.

- treemod's docstrings head their doctests `Example:` (the house style). Griffe's Google parser
  knows `Examples:` only and reads `Example:` as an admonition, whose `>>>` lines Markdown turns
  into nested quotes. The heading (a line of its own at the docstring's left margin) is renamed
  before the docstring is parsed, so the doctest renders as code.
- A field with a default (`unroll: int = field(static=True, default=1)`) is inspected as a class
  attribute holding `1`, whose docstring is `int`'s own. Such borrowed docstrings are dropped.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

_HEADING = re.compile(r"^Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Rename `Example:` headings to `Examples:`; drop attributes' docstrings of their type."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub("Examples:", obj.docstring.value)

    def on_attribute_instance(self, *, node: Any, attr: griffe.Attribute, **kwargs: Any) -> None:
        value = getattr(node, "obj", None)
        if attr.docstring is None or value is None or isinstance(value, type):
            return
        borrowed = type(value).__doc__
        if isinstance(borrowed, str) and attr.docstring.value == inspect.cleandoc(borrowed):
            attr.docstring = None
