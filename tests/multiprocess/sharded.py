"""Run in each process of tests/multiprocess/test_sharded_checkpoints.py (2 processes x 4 devices).

One run checks everything a sharded Llama does across processes, with its figures per device
and per host:

- `from_pretrained(sharding=...)`: every array split over the 8 devices (FSDP: the first axis
  that 8 divides); the bytes this process read, its addressable shards' bytes, and
  tracemalloc's peak during the load (the host copies it made);
- `save_pretrained` of that model: every process writes its own shards into one file; the
  bytes it wrote and tracemalloc's peak;
- `save_adapter` of LoRA adapters split over the 8 devices: every process writes its shards
  into one file;
- Orbax: the model and an Adam state (after one update) under `fsdp_rules` and under
  `fsdp_tp_rules`, saved by both processes; every leaf gathered whole, for the test process to
  compare with what it restores onto 1, 2 and 4 devices.
"""

from __future__ import annotations

import functools
import os
import time
import tracemalloc
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import treemod as tm
import treemod.lora as lora
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import name_tensors
from treemod.models import LlamaForCausalLM, _pretrained_load, _pretrained_save, from_pretrained
from treemod.models import save_pretrained as _save_pretrained
from treemod.models._files import Checkpoint

LLAMA = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
RULES = {"fsdp": (tm.fsdp_rules(), (8, 1)), "fsdp_tp": (tm.fsdp_tp_rules(), (2, 4))}

readers: list[Checkpoint] = []
written: list[int] = []


class _CountedCheckpoint(Checkpoint):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        readers.append(self)


def _counted_write(*args: Any, **kwargs: Any) -> int:
    n: int = _write_sharded(*args, **kwargs)
    written.append(n)
    return n


_write_sharded = _pretrained_save.write_tensors_sharded


def build(key: jax.Array) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_config(LLAMA, key=key)


def _fsdp(mesh: Mesh) -> Any:
    def where(path: str, shape: tuple[int, ...], dtype: Any) -> jax.sharding.Sharding:
        axes: list[str | None] = [None] * len(shape)
        for i, size in enumerate(shape):
            if size % mesh.size == 0:
                axes[i] = "data"
                break
        return NamedSharding(mesh, PartitionSpec(*axes))

    return where


def _local_bytes(tree: Any) -> tuple[int, int, int]:
    """This process's addressable shard bytes, the largest device's, and the whole tree's."""
    per_device: dict[Any, int] = {}
    total = 0
    for a in jax.tree.leaves(tm.filter(tree, tm.is_array)):
        total += a.nbytes
        for s in a.addressable_shards:
            per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
    return sum(per_device.values()), max(per_device.values()), total


def _traced(run: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def everything(checkpoint: str, folder: str) -> dict[str, Any]:
    """Load, save and Orbax-save a Llama across processes; figures and gathered values."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    out: dict[str, Any] = {"process_index": jax.process_index(), "devices": jax.device_count()}

    started = time.perf_counter()
    _pretrained_load.Checkpoint = _CountedCheckpoint  # type: ignore[misc]
    # Each step runs twice, measured the second time: the first compiles (tracemalloc would
    # count the compiler's Python objects, not the data).
    from_pretrained(checkpoint, sharding=_fsdp(mesh))
    readers.clear()
    model, peak = _traced(lambda: from_pretrained(checkpoint, sharding=_fsdp(mesh)))
    host, device, total = _local_bytes(model)
    arrays = jax.tree.leaves(tm.filter(model, tm.is_array))
    out["load/all_span_processes"] = all(not a.is_fully_addressable for a in arrays)
    out["load/split_8_ways"] = all(len(a.sharding.device_set) == 8 for a in arrays)
    out.update({"load/host_bytes": host, "load/device_bytes": device, "model_bytes": total})
    out["load/bytes_read"] = readers[0].bytes_read
    out["load/peak_traced"] = peak
    out["load/seconds"] = time.perf_counter() - started

    _pretrained_save.write_tensors_sharded = _counted_write  # type: ignore[assignment]
    _save_pretrained(model, os.path.join(folder, "warm-up"))
    written.clear()
    target = os.path.join(folder, "sharded")
    _, peak = _traced(lambda: _save_pretrained(model, target))
    out["save/bytes_written"] = sum(written)
    out["save/peak_traced"] = peak
    out["save/seconds"] = time.perf_counter() - started - out["load/seconds"]
    # Several weight files and an index, each file written by both processes.
    _save_pretrained(model, os.path.join(folder, "files"), max_shard_size="300KB")

    out.update(_different_paths(model, folder))
    out.update(_adapter_save(model, mesh, folder))
    out.update(_orbax_save(model, folder))
    out["seconds"] = time.perf_counter() - started
    return out


def adapters(model: LlamaForCausalLM) -> Any:
    """LoRA on two projections with random A and B (the same on every process and in the
    test)."""
    tuned = lora.add_lora(model, ["q_proj", "down_proj"], r=2, alpha=4, key=jax.random.key(7))
    keys = iter(jax.random.split(jax.random.key(5), 100))

    def b(layer: Any) -> Any:
        # A and B drawn here: add_lora's own init of A may differ in the last bit when the
        # base weight is split across processes.
        a_shape, b_shape = layer.lora_A.weight.shape, layer.lora_B.weight.shape
        return tm.tree_at(
            lambda m: (m.lora_A.weight, m.lora_B.weight),
            layer,
            (jax.random.normal(next(keys), a_shape), jax.random.normal(next(keys), b_shape)),
        )

    with tm.shape_checks(False):  # a Stack's LoRA layer holds stacked arrays
        return jax.tree.map(
            lambda x: b(x) if lora.is_lora_layer(x) else x, tuned, is_leaf=lora.is_lora_layer
        )


def _adapter_save(model: LlamaForCausalLM, mesh: Mesh, folder: str) -> dict[str, Any]:
    """The adapters (made on each process alike) split FSDP-style over both processes, then
    saved by both."""
    where = _fsdp(mesh)

    def place(x: Any) -> Any:
        if not isinstance(x, jax.Array) or not x.is_fully_addressable:
            return x  # the base model's arrays, already split
        host = np.asarray(x)
        sharding = where("", x.shape, x.dtype)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: host[index])

    tuned = jax.tree.map(place, adapters(model))
    lora.save_adapter(tuned, os.path.join(folder, "adapter"))
    named = name_tensors(tuned, NATIVE_HOOKS)
    out: dict[str, Any] = {}
    for name, value in named.items():
        if ".lora_" in name:
            out[f"adapter/spans:{name}"] = not value.is_fully_addressable
            out[f"adapter:{name}"] = np.asarray(
                multihost_utils.process_allgather(value, tiled=True)
            )
    return out


def _different_paths(model: LlamaForCausalLM, folder: str) -> dict[str, Any]:
    """Each process names its own file for arrays that span processes: the error, the files."""
    mine = os.path.join(folder, f"own-{jax.process_index()}.safetensors")
    try:
        _write_sharded(mine, [("lm_head.weight", model.lm_head.weight)], {}, "save_pretrained")
    except ValueError as e:
        return {"paths/error": str(e), "paths/left": os.path.exists(mine)}
    return {"paths/error": "", "paths/left": os.path.exists(mine)}


def _adam_step(adam: Any, state_shardings: Any, params: Any) -> Any:
    state = jax.lax.with_sharding_constraint(adam.init(params), state_shardings)
    updates, state = adam.update(jax.tree.map(jax.numpy.sin, params), state, params)
    return optax.apply_updates(params, updates), state


def _orbax_save(model: LlamaForCausalLM, folder: str) -> dict[str, Any]:
    """`model` and an Adam state after one update, under each preset, saved with Orbax."""
    out: dict[str, Any] = {}
    adam = optax.adam(1e-2)
    loaded = tm.filter(model, tm.is_array)
    for kind, (rules, shape) in RULES.items():
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "model"))
        # Resharded from the loaded placement to the preset's, across processes.
        placement = tm.model_shardings(loaded, mesh, rules)
        params = jax.jit(lambda p: p, out_shardings=placement)(loaded)
        # A stand-in gradient (the weights' sines): every moment differs from its init.
        state_shardings = tm.model_shardings(jax.eval_shape(adam.init, params), mesh, rules)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
            params, state = jax.jit(functools.partial(_adam_step, adam, state_shardings))(params)
        out[f"{kind}/spans"] = not jax.tree.leaves(params)[0].is_fully_addressable
        out[f"{kind}/opt_spans"] = all(
            not leaf.is_fully_addressable for leaf in jax.tree.leaves(state) if leaf.ndim > 1
        )
        with ocp.StandardCheckpointer() as saver:
            saver.save(os.path.join(folder, f"orbax-{kind}"), {"params": params, "opt": state})
        for path, leaf in jax.tree_util.tree_leaves_with_path({"params": params, "opt": state}):
            whole = multihost_utils.process_allgather(leaf, tiled=True)
            out[f"{kind}{jax.tree_util.keystr(path)}"] = np.asarray(whole)
    return out
