"""Checkpoints of models sharded across processes, through Orbax, and what `tm.save` does with them.

Saved by 2 processes x 2 devices (weights split across both, asynchronously while training goes
on), restored by 1 process x 4 devices, 1 process x 2 and 2 processes x 1 (resharded onto
`filter_eval_shape` skeletons that carry the new shardings). `tm.save` refuses arrays of which
other processes hold parts, and writes those each process holds whole (replicated, or split over
its own devices only). References: a plain-JAX run of the same training
(tests/multiprocess/test_training.py's), the model built from the same key in this process, and
the `safetensors` package reading `tm.save`'s files.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import treemod as tm
from multiprocess import harness, training
from multiprocess.conftest import Launch
from multiprocess.test_training import NAMES, _reference

# One xdist worker runs them all (`make test`: -n 2 --dist loadgroup), so each run starts once.
pytestmark = pytest.mark.heavy  # processes talking through jax.distributed

pytest.importorskip("orbax.checkpoint")  # an optional dependency (the multihost extra)

Results = list[dict[str, np.ndarray]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multihost-checkpoints")


@pytest.fixture(scope="module")
def saved(launch: Launch, folder: Path) -> Results:
    target = "multiprocess.checkpointing:save_while_training"
    return launch(target, processes=2, devices=2, folder=str(folder))


@pytest.fixture(scope="module", params=[(1, 4), (1, 2), (2, 1)], ids=["1x4", "1x2", "2x1"])
def restored(
    request: pytest.FixtureRequest, launch: Launch, folder: Path, saved: Results
) -> Results:
    processes, devices = request.param
    target = "multiprocess.checkpointing:restore"
    return launch(target, processes=processes, devices=devices, folder=str(folder), steps=[1, 3])


def test_training_while_saving_matches_the_reference(saved: Results) -> None:
    losses, params, mean, _ = _reference(norm=True)
    for result in saved:
        assert bool(result["spans"])  # the weights really span both processes
        np.testing.assert_allclose(result["losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(
            result["last/.net.norm.running_mean.value"], mean, rtol=1e-5, atol=1e-6
        )
        for short, name in NAMES.items():
            np.testing.assert_allclose(
                result[f"last/.net{name}"], params[short], rtol=1e-5, atol=1e-6
            )
        assert result["steps"].tolist() == [1, 3]
        # Asynchronous: save(1) returned before its checkpoint was written, not after.
        assert bool(result["saving_when_returned"])
        assert not bool(result["saving_when_finished"])
        assert int(result["last/.step"]) == 3


def test_tm_save_refuses_arrays_spanning_processes_and_writes_nothing(saved: Results) -> None:
    for i, result in enumerate(saved):
        message = str(result["tm_save_error"])
        assert message.startswith("save: the array at .net.first.weight (shape (8, 3)")
        assert f"spans 2 processes, and this process ({i}) holds only some" in message
        assert "docs/concepts/many-hosts.md" in message
        assert not bool(result["tm_save_wrote"])


@pytest.mark.parametrize("kind", ["replicated", "within"])
def test_tm_save_writes_arrays_that_span_processes_but_each_holds_whole(
    kind: str, saved: Results, folder: Path
) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    _, params, mean, var = _reference(norm=True)
    expected = {f".net{name}": params[short] for short, name in NAMES.items()}
    expected[".net.norm.running_mean.value"] = mean
    expected[".net.norm.running_var.value"] = var
    for i, result in enumerate(saved):
        assert bool(result[f"{kind}/spans"])  # not fully addressable, yet held whole here
        assert bool(result[f"{kind}/fully_replicated"]) == (kind == "replicated")
        path = folder / f"{kind}-{i}.safetensors"
        # Read by the safetensors package, not treemod: the values of the last step.
        tensors = safetensors_numpy.load_file(str(path))
        assert tensors.keys() == {*expected, ".key", ".step"}
        for name, want in expected.items():
            np.testing.assert_allclose(tensors[name], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(tensors[".key"], result["last/key_data"])
        assert int(tensors[".step"]) == 3
        # And back through tm.load: a typed key, the State wrapper, the static field from like.
        from multiprocess import checkpointing  # imports orbax: after the skip above

        loaded = tm.load(path, like=checkpointing.fresh())
        assert loaded.name == "run-1"
        assert type(loaded.net.norm.running_mean).__name__ == "State"
        np.testing.assert_array_equal(jax.random.key_data(loaded.key), result["last/key_data"])


def test_equinox_format_refuses_arrays_spanning_processes_and_writes_nothing(
    saved: Results,
) -> None:
    for result in saved:
        message = str(result["equinox_error"])
        # tm.save's refusal (the Orbax recipe, process_allgather), naming this function
        assert message.startswith("tree_serialise_leaves: the array at .net.first.weight ")
        assert "Orbax" in message and "docs/concepts/many-hosts.md" in message
        assert message == "tree_serialise_leaves" + str(result["tm_save_error"])[len("save") :]
        assert not bool(result["equinox_wrote"])


def test_tm_load_places_a_gathered_checkpoint_on_shardings_across_processes(
    saved: Results,
) -> None:
    for result in saved:
        assert bool(result["tm_load_equal"])
        assert bool(result["tm_load_spans"])
        assert bool(result["tm_load_skeleton_equal"])
        assert bool(result["tm_load_skeleton_spans"])


def test_restore_onto_other_devices_gives_the_saved_model(
    saved: Results, restored: Results
) -> None:
    for result in restored:
        _check_restored(result, saved, processes=len(restored))


def _check_restored(result: dict[str, np.ndarray], saved: Results, processes: int) -> None:
    assert int(result["processes"]) == processes
    # Each device holds its rows of the split weight: as many devices as the run had.
    devices = training.BATCH // int(result["3/shard_rows"])
    assert devices == int(result["devices"]) and devices in (2, 4)
    assert int(result["latest"]) == 3
    for step, prefix in ((1, "step1"), (3, "last")):
        assert str(result[f"{step}/type"]) == "Trainer"
        assert str(result[f"{step}/name"]) == "run-1"  # a static field, from the skeleton
        assert str(result[f"{step}/state_type"]) == "State"
        assert str(result[f"{step}/key_impl"]) == str(jax.random.key_impl(jax.random.key(0)))
        assert bool(result[f"{step}/sharding_matches"])  # the skeleton's sharding, not the saved
        for name in [
            *(f".net{n}" for n in NAMES.values()),
            ".key",
            ".step",
            ".net.norm.running_mean.value",
            ".net.norm.running_var.value",
        ]:
            # Both saving processes agree, and the restored arrays are what they saved.
            np.testing.assert_array_equal(
                saved[0][f"{prefix}/{name}"], saved[1][f"{prefix}/{name}"]
            )
            np.testing.assert_array_equal(result[f"{step}/{name}"], saved[0][f"{prefix}/{name}"])
    # The key came back as a typed key with the key data the run ended with.
    np.testing.assert_array_equal(result["3/.key"], saved[0]["last/key_data"])
    assert int(result["1/.step"]) == 1


def test_the_first_checkpoint_holds_step_one_not_later_steps(
    saved: Results, restored: Results
) -> None:
    # Saved asynchronously while two more steps ran: the checkpoint is the step-1 model.
    xs, ys = training.data()
    model = training.NormNet(jax.random.key(0))
    model, _ = training.norm_step(model, xs[0], ys[0])
    for result in restored:
        np.testing.assert_allclose(
            result["1/.net.first.weight"], np.asarray(model.first.weight), rtol=1e-5, atol=1e-6
        )
        assert not np.allclose(result["1/.net.first.weight"], result["3/.net.first.weight"])


def test_a_process_dying_mid_save_leaves_the_last_complete_checkpoint(
    launch: Launch, tmp_path: Path
) -> None:
    # Process 0 would wait for process 1 in its save: the run must fail at once, not hang.
    with pytest.raises(harness.ProcessesFailed) as info:
        launch(
            "multiprocess.checkpointing:die_while_saving",
            processes=2,
            devices=2,
            folder=str(tmp_path),
        )
    message = str(info.value)
    assert "process 1 of 2 failed" in message and "process 1 dies now" in message
    # Step 2 never committed: a restart (here, this process with its 8 devices) sees step 1.
    from multiprocess import checkpointing  # imports orbax: after the skip above

    result = checkpointing.restore(str(tmp_path), steps=[1])
    assert int(result["latest"]) == 1
    assert int(result["1/.step"]) == 0
    # Initialised here and in the launched processes: XLA may round the last bit differently.
    np.testing.assert_allclose(
        result["1/.net.first.weight"],
        np.asarray(training.NormNet(jax.random.key(0)).first.weight),
        rtol=1e-6,
    )
