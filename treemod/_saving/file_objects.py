"""Checks on the open file objects given to `save`, `load` and other formats' readers, writers."""

from __future__ import annotations

import io
from typing import Any, Literal

from treemod._saving.errors import CheckpointError

__all__ = ["check_file_object", "file_label"]


def file_label(obj: Any) -> str:
    """How messages name an open file: its quoted name, else `<its type>`."""
    name = getattr(obj, "name", None)
    return f"'{name}'" if isinstance(name, str) else f"<{type(obj).__name__}>"


def check_file_object(obj: Any, label: str, caller: str, use: Literal["read", "write"]) -> None:
    """Refuse, naming the file, an object a checkpoint cannot be read from or written to:
    text mode, closed, or not open for `use`.

    Reading raises `CheckpointError` (the file cannot be read as a checkpoint); writing raises
    `TypeError` for text mode and `ValueError` otherwise, as Python's own file objects do."""
    flag, gerund = ("rb", "reading") if use == "read" else ("wb", "writing")
    if isinstance(obj, io.TextIOBase):
        raise (CheckpointError if use == "read" else TypeError)(
            f"{caller}: {label} is opened in text mode; checkpoints are binary: open it with "
            f"open(path, '{flag}')."
        )
    error = CheckpointError if use == "read" else ValueError
    if getattr(obj, "closed", False):
        preposition = "from" if use == "read" else "to"
        raise error(f"{caller}: {label} is closed; open it again to {use} {preposition} it.")
    able = getattr(obj, "readable" if use == "read" else "writable", None)
    try:
        ok = able() if callable(able) else True
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise error(
            f"{caller}: {label} is not open for {gerund}; open it with open(path, '{flag}')."
        )
