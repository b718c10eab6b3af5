"""Checkpoints of trees whose arrays span processes, through Orbax (run by harness.run_function).

`save_while_training` (2 processes x 2 devices) trains a model whose weights are sharded across
both processes, saves it with Orbax's `CheckpointManager` asynchronously at step 1 while training
goes on, then again at the last step, and checks that `tm.save` refuses the tree. `restore`
(any number of processes and devices) builds the skeleton with `tm.filter_eval_shape`, gives it
this run's shardings, and restores the checkpoint onto them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import treemod as tm
import treemod.compat.equinox as ceqx
from multiprocess import training


class Trainer(tm.Module):
    """What a training run checkpoints: the model (with BatchNorm `State`), a PRNG key, a step
    count, and a static field (not stored: it comes from the skeleton)."""

    net: training.NormNet
    key: jax.Array
    step: jax.Array
    name: str = tm.field(static=True)


def fresh() -> Trainer:
    """The state before training, the same on every process."""
    return Trainer(
        training.NormNet(jax.random.key(0)), jax.random.key(7), jnp.zeros((), jnp.int32), "run-1"
    )


def shardings(tree: Any) -> Any:
    """Weights split along their first axis over every device (of every process); the rest
    (biases, BatchNorm statistics, the key, the step) replicated."""
    mesh = Mesh(np.array(jax.devices()), ("data",))

    def place(leaf: Any) -> NamedSharding:
        split = leaf.ndim == 2 and leaf.shape[0] % jax.device_count() == 0
        return NamedSharding(mesh, P("data", None) if split else P())

    return jax.tree.map(place, tm.filter(tree, tm.is_array))


def placed_skeleton(build: Any) -> Any:
    """What `build()` returns, as `tm.filter_eval_shape` describes it, each array with the
    sharding `shardings` gives it (filter_eval_shape's skeletons carry none)."""
    skeleton = tm.filter_eval_shape(build)
    placed = jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        tm.filter(skeleton, tm.is_array),
        shardings(skeleton),
    )
    return tm.combine(placed, skeleton)


def _step(trainer: Trainer, x: jax.Array, y: jax.Array) -> tuple[Trainer, jax.Array]:
    net, loss = training.norm_step(trainer.net, x, y)
    key, _ = jax.random.split(trainer.key)
    return tm.tree_at(lambda t: (t.net, t.key, t.step), trainer, (net, key, trainer.step + 1)), loss


def save_while_training(folder: str) -> dict[str, Any]:
    """Train three steps, saving asynchronously after the first and after the last."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch = NamedSharding(mesh, P("data"))
    # Built inside filter_jit, each process computes only its own shards. (Outside, device_put
    # cannot place a PRNG key array on devices of other processes.)
    trainer = tm.filter_jit(lambda: tm.filter_shard(fresh(), shardings(fresh())))()
    out: dict[str, Any] = {"spans": not trainer.net.first.weight.is_fully_addressable}

    # tm.save refuses, naming the leaf and the recipe, and writes nothing.
    target = os.path.join(folder, f"tm-{jax.process_index()}.safetensors")
    try:
        tm.save(target, trainer)
    except tm.CheckpointError as e:
        out["tm_save_error"] = str(e)
    out["tm_save_wrote"] = _left(folder, "tm-")

    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
    xs, ys = training.data()
    losses = []
    with ocp.CheckpointManager(os.path.join(folder, "orbax"), options=options) as manager:
        for i, (xg, yg) in enumerate(zip(xs, ys, strict=True)):
            x = jax.make_array_from_process_local_data(batch, training.local_rows(xg))
            y = jax.make_array_from_process_local_data(batch, training.local_rows(yg))
            trainer, loss = _step(trainer, x, y)
            losses.append(float(loss))
            if i == 0:
                manager.save(1, args=ocp.args.StandardSave(trainer))
                # save returned with the writing still going on (tens of ms here): training
                # goes on meanwhile.
                out["saving_when_returned"] = manager.is_saving_in_progress()
                out.update({f"step1/{k}": v for k, v in training.gathered(trainer).items()})
        manager.save(int(trainer.step), args=ocp.args.StandardSave(trainer))
        manager.wait_until_finished()
        out["saving_when_finished"] = manager.is_saving_in_progress()
        out["steps"] = np.array(manager.all_steps())
    out["losses"] = np.array(losses)
    out.update({f"last/{k}": v for k, v in training.gathered(trainer).items()})

    # The other way, for models one host can hold: gather, tm.save from process 0, and let every
    # process tm.load onto its own shardings (the file on a disk all can read).
    arrays = tm.filter(trainer.net, tm.is_array)
    whole = jax.tree.map(lambda a: multihost_utils.process_allgather(a, tiled=True), arrays)
    path = os.path.join(folder, "gathered.safetensors")
    if jax.process_index() == 0:
        tm.save(path, tm.combine(whole, trainer.net))
    multihost_utils.sync_global_devices("tm.save done")
    loaded = tm.load(path, like=trainer.net)
    out["tm_load_equal"] = bool(tm.filter_jit(tm.tree_equal)(loaded, trainer.net))
    out["tm_load_spans"] = not loaded.first.weight.is_fully_addressable
    # Onto a filter_eval_shape skeleton whose arrays carry shardings across processes.
    skeleton = placed_skeleton(lambda: training.NormNet(jax.random.key(0)))
    from_skeleton = tm.load(path, like=skeleton)
    out["tm_load_skeleton_equal"] = bool(tm.filter_jit(tm.tree_equal)(from_skeleton, trainer.net))
    out["tm_load_skeleton_spans"] = not from_skeleton.first.weight.is_fully_addressable
    out["last/key_data"] = np.asarray(jax.random.key_data(trainer.key))
    out.update(_save_held_whole(trainer, folder))
    out.update(_equinox_format(trainer, folder))
    return out


def _save_held_whole(trainer: Trainer, folder: str) -> dict[str, Any]:
    """`tm.save` on every process of arrays that span processes but that each process holds
    whole: replicated everywhere (data parallel), and split over each process's own devices
    only (tensor parallel within a host, data parallel across hosts)."""
    everywhere = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P())
    hosts = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ("hosts", "local"))

    def within(leaf: Any) -> NamedSharding:
        split = leaf.ndim == 2 and leaf.shape[0] % hosts.shape["local"] == 0
        return NamedSharding(hosts, P("local", None) if split else P())

    out: dict[str, Any] = {}
    for kind, place in (("replicated", lambda _: everywhere), ("within", within)):
        placed = tm.filter_jit(
            lambda t, p=place: tm.filter_shard(t, jax.tree.map(p, tm.filter(t, tm.is_array)))
        )(trainer)
        weight = placed.net.first.weight
        out[f"{kind}/spans"] = not weight.is_fully_addressable
        out[f"{kind}/fully_replicated"] = weight.is_fully_replicated
        # Every process writes its own file (a shared disk would take one, from process 0).
        tm.save(os.path.join(folder, f"{kind}-{jax.process_index()}.safetensors"), placed)
    return out


def _equinox_format(trainer: Trainer, folder: str) -> dict[str, Any]:
    """`treemod.compat.equinox.tree_serialise_leaves` (Equinox's format) of the tree sharded
    across processes: its error, and whether a file was left."""
    target = os.path.join(folder, f"equinox-{jax.process_index()}.eqx")
    try:
        ceqx.tree_serialise_leaves(target, trainer)
    except RuntimeError as e:
        return {"equinox_error": str(e), "equinox_wrote": _left(folder, "equinox-")}
    return {"equinox_error": "", "equinox_wrote": _left(folder, "equinox-")}


def _left(folder: str, prefix: str) -> bool:
    """Whether this process left any file (or temporary) whose name has `prefix` in `folder`."""
    mine = f"{prefix}{jax.process_index()}"
    return any(mine in n for n in os.listdir(folder))


def restore(folder: str, steps: list[int]) -> dict[str, Any]:
    """Restore each of `steps` onto this run's devices; what came back, prefixed by the step."""
    skeleton = placed_skeleton(fresh)
    out: dict[str, Any] = {"processes": jax.process_count(), "devices": jax.device_count()}
    with ocp.CheckpointManager(os.path.join(folder, "orbax")) as manager:
        out["latest"] = manager.latest_step()
        for step in steps:
            restored = manager.restore(step, args=ocp.args.StandardRestore(skeleton))
            facts = {
                "type": type(restored).__name__,
                "name": restored.name,
                "state_type": type(restored.net.norm.running_mean).__name__,
                "key_impl": str(jax.random.key_impl(restored.key)),
                "sharding_matches": restored.net.first.weight.sharding.is_equivalent_to(
                    skeleton.net.first.weight.sharding, 2
                ),
                "shard_rows": restored.net.first.weight.addressable_shards[0].data.shape[0],
                **training.gathered(restored),
            }
            out.update({f"{step}/{k}": v for k, v in facts.items()})
    return out


def die_while_saving(folder: str) -> dict[str, Any]:
    """Save step 1; then process 1 dies while process 0 saves step 2 (which never commits)."""
    trainer = tm.filter_jit(lambda: tm.filter_shard(fresh(), shardings(fresh())))()
    manager = ocp.CheckpointManager(
        os.path.join(folder, "orbax"),
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True),
    )
    manager.save(1, args=ocp.args.StandardSave(trainer))
    manager.wait_until_finished()
    if jax.process_index() == 1:
        print("process 1 dies now", flush=True)
        os._exit(3)
    trainer = tm.tree_at(lambda t: t.step, trainer, trainer.step + 1)
    manager.save(2, args=ocp.args.StandardSave(trainer))
    manager.wait_until_finished()  # waits for process 1 forever: the harness stops the run
    return {}
