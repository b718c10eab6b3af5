"""One module per framework (`jax_dicts`, `treemod_models`, ...), each with `build(workload)`.

`spec` defines the workloads and the parameter counts all frameworks must reach; `case` the
interface a framework module returns. Framework modules are imported only inside the worker
process that measures them.
"""

MODULES = {
    "jax": "benchmarks.workloads.jax_dicts",
    "treemod": "benchmarks.workloads.treemod_models",
    "equinox": "benchmarks.workloads.equinox_models",
    "nnx": "benchmarks.workloads.nnx_models",
    "nnx_tree": "benchmarks.workloads.nnx_tree_models",
    "linen": "benchmarks.workloads.linen_models",
    "haiku": "benchmarks.workloads.haiku_models",
}
