"""The saving feature's error: `CheckpointError`, raised by `tm.load` and the file reader."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint file is damaged, is not a treemod checkpoint, or does not match `like`.

    The message names the file and every key path involved. Nothing is returned half-loaded.

    Example:
        >>> import io, treemod as tm
        >>> try:
        ...     tm.load(io.BytesIO(b"not a checkpoint"), like=[])
        ... except tm.CheckpointError as e:
        ...     print(str(e)[:60])
        <BytesIO> is not a treemod checkpoint: its first 8 bytes say
    """
