"""benchmarks/generation.py: its `--quick` smoke run reports speeds, equal tokens, one trace."""

from __future__ import annotations

import json

import pytest

from benchmarks import generation

pytestmark = pytest.mark.heavy  # benchmark smoke runs: `make test-fast` leaves them out


def test_quick_run_reports_speeds_and_one_trace_per_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert generation.main(["--quick"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["contenders"]) == {"treemod", "transformers"}
    for figures in summary["contenders"].values():
        assert figures["tokens_per_s"] > 0
    assert summary["identical_tokens"] is True
    assert summary["compilations"]["program_traces"] == 1
    assert summary["compilations"]["forward_traces"] == [[1, generation.PROMPT], [1, 1]]
    assert "tokens/s" in out
