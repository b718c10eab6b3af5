"""A Llama sharded over 2 processes x 4 devices: loaded, saved and checkpointed without any
host holding the whole model (one run of tests/multiprocess/sharded.py). (`tm.sharded_init`'s
share per host and per device: docs/sharding.md's recipe, tests/multiprocess/test_sharding_page.py.)

References: `transformers` (the checkpoint it wrote, and its model loading the file the
processes saved, logits compared), the file a one-device `save_pretrained` writes (byte for
byte), and the values the saving processes gathered (what Orbax restores here, in one process,
onto 1, 2 and 4 devices with the rule table's shardings for the smaller mesh).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import treemod as tm
import treemod.lora as lora
from multiprocess.conftest import Launch
from treemod.models import from_pretrained, save_pretrained

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.xdist_group("multiprocess")]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ocp = pytest.importorskip("orbax.checkpoint")
optax = pytest.importorskip("optax")

Results = list[dict[str, np.ndarray]]
IDS = np.array([[1, 5, 9, 3, 7, 2, 4, 4], [8, 0, 3, 3, 6, 1, 2, 9]])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A random Llama written by `transformers`, and its logits on IDS."""
    from multiprocess.sharded import LLAMA

    directory = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    model.save_pretrained(directory)
    with torch.no_grad():
        logits = model(torch.tensor(IDS)).logits.numpy()
    return directory, logits


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-run")


@pytest.fixture(scope="module")
def run(launch: Launch, checkpoint: tuple[Path, np.ndarray], folder: Path) -> Results:
    return launch(
        "multiprocess.sharded:everything",
        processes=2,
        devices=4,
        checkpoint=str(checkpoint[0]),
        folder=str(folder),
    )


def test_from_pretrained_splits_every_array_and_each_host_reads_half(run: Results) -> None:
    total = int(run[0]["model_bytes"])
    for i, result in enumerate(run):
        assert int(result["process_index"]) == i and int(result["devices"]) == 8
        assert bool(result["load/all_span_processes"]) and bool(result["load/split_8_ways"])
        # Per host: its 4 devices' shards, exactly half; per device an eighth.
        assert int(result["load/host_bytes"]) == total // 2
        assert int(result["load/device_bytes"]) == total // 8
        assert int(result["load/bytes_read"]) == total // 2
        # Host copies while loading (tracemalloc, a second load: the first compiles): its
        # half and a little, never the model (measured 0.58x of the model, 1.15x its half).
        assert int(result["load/peak_traced"]) < 0.75 * total, int(result["load/peak_traced"])


def test_save_pretrained_across_processes_equals_the_one_device_file(
    run: Results, checkpoint: tuple[Path, np.ndarray], folder: Path, tmp_path: Path
) -> None:
    directory, hf_logits = checkpoint
    save_pretrained(from_pretrained(directory), tmp_path / "whole")
    got = (folder / "sharded" / "model.safetensors").read_bytes()
    assert got == (tmp_path / "whole" / "model.safetensors").read_bytes()
    # The same files (config.json, generation_config.json, weights), no temporaries left.
    names = sorted(p.name for p in (folder / "sharded").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "whole").iterdir())
    for name in names:
        assert (folder / "sharded" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    # Each process wrote the bytes of its own shards: half the tensors each, none twice.
    header = int.from_bytes(got[:8], "little")
    data = len(got) - 8 - header
    written = [int(r["save/bytes_written"]) for r in run]
    assert written == [data // 2, data // 2]
    # No host gathered the model: tracemalloc's peak during a second save (measured 0.09x).
    total = int(run[0]["model_bytes"])
    for result in run:
        assert int(result["save/peak_traced"]) < 0.25 * total, int(result["save/peak_traced"])
    # With max_shard_size: the same weight files and index as one device writes.
    save_pretrained(from_pretrained(directory), tmp_path / "files", max_shard_size="300KB")
    names = sorted(p.name for p in (folder / "files").iterdir())
    assert len(names) > 5 and "model.safetensors.index.json" in names
    assert names == sorted(p.name for p in (tmp_path / "files").iterdir())
    for name in names:
        assert (folder / "files" / name).read_bytes() == (tmp_path / "files" / name).read_bytes()
    # transformers loads the file and computes the original model's logits.
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder / "sharded").eval()
    with torch.no_grad():
        logits = reloaded(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_array_equal(logits, hf_logits)


def test_save_adapter_across_processes_equals_the_one_device_files(
    run: Results, checkpoint: tuple[Path, np.ndarray], folder: Path, tmp_path: Path
) -> None:
    from multiprocess.sharded import adapters

    spans = {k: bool(v) for k, v in run[0].items() if k.startswith("adapter/spans:")}
    assert len(spans) == 8 and all(spans.values())  # A and B of 2 projections in 2 layers
    # The same arrays on one device (the processes' gathered values: a random draw may differ
    # in the last bit between the two set-ups).
    values = {k.split(":", 1)[1]: v for k, v in run[0].items() if k.startswith("adapter:")}
    one, _ = tm.load_state_dict(adapters(from_pretrained(checkpoint[0])), values, strict=False)
    lora.save_adapter(one, tmp_path)
    names = sorted(p.name for p in (folder / "adapter").iterdir())
    assert names == ["adapter_config.json", "adapter_model.safetensors"]  # no temporaries
    for name in names:
        assert (folder / "adapter" / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_processes_given_different_paths_are_told_and_leave_no_file(
    run: Results, folder: Path
) -> None:
    for i, result in enumerate(run):
        message = str(result["paths/error"])
        assert message.startswith("save_pretrained: the processes were given different paths")
        assert f"{str(folder / f'own-{i}.safetensors')!r} on process {i}" in message
        assert "every process calls save_pretrained with the same path" in message
        assert not bool(result["paths/left"])


def _target(tree: Any, mesh: Any, rules: Any) -> Any:
    shardings = tm.model_shardings(tree, mesh, rules)
    return jax.tree.map(
        lambda s, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        shardings,
        tree,
        is_leaf=lambda s: isinstance(s, jax.sharding.Sharding),
    )


@pytest.mark.parametrize("kind", ["fsdp", "fsdp_tp"])
@pytest.mark.parametrize("devices", [(1, 1), (2, 1), (2, 2), (4, 1)], ids=str)
def test_orbax_restores_onto_one_process_and_fewer_devices(
    run: Results, folder: Path, kind: str, devices: tuple[int, int]
) -> None:
    from multiprocess.sharded import RULES, build

    rules = RULES[kind][0]
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[: devices[0] * devices[1]]).reshape(devices), ("data", "model")
    )
    params = tm.filter(tm.filter_eval_shape(build, jax.random.key(0)), tm.is_array)
    state = jax.eval_shape(optax.adam(1e-2).init, params)
    target = {"params": _target(params, mesh, rules), "opt": _target(state, mesh, rules)}
    with ocp.StandardCheckpointer() as loader:
        restored = loader.restore(folder / f"orbax-{kind}", target)
    assert bool(run[0][f"{kind}/spans"]) and bool(run[0][f"{kind}/opt_spans"])
    leaves = jax.tree_util.tree_leaves_with_path(restored)
    assert len(leaves) > 20
    for path, leaf in leaves:
        assert leaf.sharding.device_set == set(mesh.devices.flat)
        saved = run[0][f"{kind}{jax.tree_util.keystr(path)}"]
        np.testing.assert_array_equal(np.asarray(leaf), saved, err_msg=jax.tree_util.keystr(path))
        np.testing.assert_array_equal(saved, run[1][f"{kind}{jax.tree_util.keystr(path)}"])
    # The moments moved (one update with a gradient of the weights' sines).
    mu = jax.tree.leaves(restored["opt"][0].mu)[0]
    assert float(np.abs(np.asarray(mu)).max()) > 0
