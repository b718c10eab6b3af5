"""`from_pretrained(..., sharding=...)` in 2 processes x 2 CPU devices.

A GPT-2 checkpoint (written here with `transformers`, randomly initialised) is loaded with each
array split over all four devices: each process reads at most 60% of the checkpoint's tensor
bytes (counted by the reader), every array spans both processes, and the arrays gathered back
equal the `transformers` model's tensors and the model loaded on one process.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers

import treemod as tm
from multiprocess.conftest import Launch
from treemod.models import from_pretrained

pytestmark = pytest.mark.xdist_group("multiprocess")

Results = list[dict[str, np.ndarray]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    directory = tmp_path_factory.mktemp("sharded-gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    return directory, {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def loaded(launch: Launch, checkpoint: tuple[Path, dict[str, np.ndarray]]) -> Results:
    return launch(
        "multiprocess.pretrained:load_sharded", processes=2, devices=2, directory=str(checkpoint[0])
    )


def test_each_process_reads_at_most_60_percent_of_the_bytes(loaded: Results) -> None:
    assert [int(r["process_index"]) for r in loaded] == [0, 1]
    for result in loaded:
        assert bool(result["all_span_processes"])
        share = int(result["bytes_read"]) / int(result["total_bytes"])
        assert 0.4 <= share <= 0.6, share


def test_the_gathered_model_equals_transformers_and_a_one_process_load(
    loaded: Results, checkpoint: tuple[Path, dict[str, np.ndarray]]
) -> None:
    directory, hf = checkpoint
    single = from_pretrained(directory)
    names = jax.tree_util.tree_flatten_with_path(tm.filter(single, tm.is_array))[0]
    for result in loaded:
        for path, leaf in names:
            name = jax.tree_util.keystr(path, simple=True, separator=".")
            np.testing.assert_array_equal(result[name], np.asarray(leaf), err_msg=name)
        np.testing.assert_array_equal(result["transformer.wte.weight"], hf["lm_head.weight"])
        c_fc = result["transformer.h.layers.mlp.c_fc.weight"]
        np.testing.assert_array_equal(c_fc[1], hf["transformer.h.1.mlp.c_fc.weight"])
