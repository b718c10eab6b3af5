"""benchmarks/models_forward.py: a `--quick` smoke run of two families, and its arguments."""

from __future__ import annotations

import json

import pytest

from benchmarks import models_forward

pytestmark = pytest.mark.heavy  # benchmark smoke runs: `make test-fast` leaves them out


def test_quick_run_reports_each_contender_and_agreement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert models_forward.main(["--quick", "--rounds", "1", "--families", "bert,resnet"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["families"]) == {"bert", "resnet"}
    for figures in summary["families"].values():
        assert set(figures["contenders"]) == {"treemod", "torch"}
        assert figures["contenders"]["treemod"]["ratio_to_treemod"] == 1.0
        assert all(c["median_s"] > 0 for c in figures["contenders"].values())
        assert figures["max_rel_error"] < 1e-5  # the two compute the same numbers
    assert "torch/treemod" in out


def test_every_family_is_a_treemod_model_and_unknown_ones_are_refused() -> None:
    import importlib

    for _, module, name, *_ in models_forward.FAMILIES.values():
        assert hasattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit):
        models_forward.main(["--quick", "--families", "alexnet"])
