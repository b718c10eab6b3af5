"""The `__treescope_repr__` method of `treemod.Module` (treescope's extension hook).

treescope calls `__treescope_repr__(path, subtree_renderer)` on any object whose class defines
it, whichever of treescope and treemod was imported first. The method lives here, not in
`_module/` (a lower layer), and loads the renderer in `treescope_view.py` (which imports
treescope and `treemod.nn`) only when treescope renders a module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["treescope_repr"]


def treescope_repr(self: Any, path: str | None, subtree_renderer: Any) -> Any:
    """Render a treemod module for treescope: fields, counts, static fields, `State`, `Stack`.

    Arguments:
        path: the key path of this node, as treescope passes it.
        subtree_renderer: treescope's renderer for the children.

    Returns:
        treescope's rendering of the module.
    """
    from treemod._display.treescope_view import render_module

    return render_module(self, path, subtree_renderer)
