"""Shared by the GPT-2 and Llama-family tests: `transformers` twins of treemod's models.

`pair(...)` builds a randomly initialised `transformers` model from a config dict (through its
config class's `from_dict`, as a `config.json` is read), builds treemod's model from the same
dict, and moves the weights with `tm.load_state_dict(model, hf_model.state_dict())` (the tied
alias, if any, checked equal to its source and left out: the model holds one array).
`run` calls a model compiled; `relative_error` is the measure the issue sets: max abs error
over max abs value.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

import treemod as tm

RTOL = 1e-5


def pair(hf_cls: Any, config_cls: Any, tm_cls: Any, config: dict[str, Any], attn: str = "sdpa"):
    """`(hf_model, tm_model)` with equal weights, from one config dict."""
    torch.manual_seed(0)
    hf = hf_cls(config_cls.from_dict({**config, "attn_implementation": attn})).eval()
    with torch.no_grad():  # random norm weights and biases too, so that their names matter
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    # A shape-only skeleton (from_config traces under filter_eval_shape, as loading needs),
    # filled by load_state_dict: no random initialisation to compile.
    model = tm.filter_eval_shape(lambda: tm_cls.from_config(config, key=jax.random.key(0)))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for alias, source in model.tied_weights().items():
        np.testing.assert_array_equal(state.pop(alias), state[source])
    model = tm.load_state_dict(model, state)
    names = set(tm.state_dict(model))
    assert names == set(state), names ^ set(state)
    return hf, model


# One compiled function per model class: each test file compiles its family's configs (a
# version each), and one function shared by every family would pass filter_jit's warning at 64
# versions within one test process.
_RUNS: dict[type, Any] = {}


def run(model: Any, inputs: dict[str, Any]) -> Any:
    """`model(**inputs)`, compiled (one program instead of many small eager ones)."""
    compiled = _RUNS.get(type(model))
    if compiled is None:
        compiled = _RUNS[type(model)] = tm.filter_jit(lambda m, i: m(**i))
    return compiled(model, inputs)


def hf_output(hf: Any, **inputs: Any) -> np.ndarray:
    """The `transformers` model's `logits` (or `last_hidden_state`) for NumPy inputs."""
    with torch.no_grad():
        out = hf(**{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return value.numpy()


def relative_error(got: Any, want: np.ndarray, keep: np.ndarray | None = None) -> float:
    """max |got - want| / max |want|, over the positions `keep` (a `(batch, seq)` mask) only."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    if keep is not None:
        got, want = got[keep.astype(bool)], want[keep.astype(bool)]
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def padded_batch(vocab: int, batch: int = 3, seq: int = 7, seed: int = 0):
    """Token ids and a left-padded attention mask: row 0 full, the others 1-3 pads."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    for row in range(1, batch):
        mask[row, : 1 + (row - 1) % 3] = 0
    return ids, mask
