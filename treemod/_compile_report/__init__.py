"""`treemod.debug.compile_report`: what tracing and lowering cost per module path (see README)."""
