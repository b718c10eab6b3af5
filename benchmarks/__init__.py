"""treemod's benchmark suite: compile speed and step time against plain JAX and peer libraries.

Run `python -m benchmarks.run --help`. Nothing here imports JAX at package import time, so the
worker processes can time their own imports.
"""
