"""Compatibility namespaces: other libraries' APIs adapted over treemod's modules and transforms.

`treemod.compat.equinox` gives Equinox's names, signatures and behaviour, so Equinox code runs
after changing `import equinox as eqx` to `import treemod.compat.equinox as eqx`.
"""
