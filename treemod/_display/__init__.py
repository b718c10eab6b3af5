"""Seeing models: treescope views (`treescope_view.py`) and `summary` (`summary.py`).

Nothing here imports treescope at import time: `hook.py` holds the `__treescope_repr__`
method that `treemod/__init__.py` puts on `Module`, and it loads the renderer at the first
render, when treescope is already imported (it is the caller).
"""
