"""benchmarks/pretrained_load.py: its `--quick` smoke run, and its checkpoint is GPT-2's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file

from benchmarks import pretrained_load

pytestmark = pytest.mark.heavy  # benchmark smoke runs: `make test-fast` leaves them out


def test_quick_run_reports_every_contender(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--quick", "--contenders", "treemod,safetensors+device_put"]
    assert pretrained_load.main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["contenders"]) == {"treemod", "safetensors+device_put"}
    reference = summary["contenders"]["safetensors+device_put"]
    assert reference["ratio_to_safetensors"] == 1.0
    for figures in summary["contenders"].values():
        assert figures["median_s"] > 0 and figures["peak_rss_x_checkpoint"] > 0
    assert "x safetensors" in out and "peak RSS x size" in out


def test_contenders_must_include_the_reference() -> None:
    with pytest.raises(SystemExit):
        pretrained_load.main(["--quick", "--contenders", "treemod"])


def test_the_written_checkpoint_is_what_transformers_gpt2_holds(tmp_path: Path) -> None:
    size = pretrained_load.write_checkpoint(tmp_path, pretrained_load.TINY)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert size == sum(v.nbytes for v in tensors.values())
    config = transformers.GPT2Config(**pretrained_load.TINY)
    expected = transformers.GPT2LMHeadModel(config).state_dict()
    expected.pop("lm_head.weight")  # tied: transformers writes the embedding only
    assert {k: tuple(v.shape) for k, v in expected.items()} == {
        k: v.shape for k, v in tensors.items()
    }
    assert all(v.dtype == np.float32 for v in tensors.values())
