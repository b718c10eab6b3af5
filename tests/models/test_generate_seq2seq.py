"""`generate_seq2seq` against `transformers`' encoder-decoder `generate(do_sample=False)`.

T5 twins (`lm_reference.pair`, weights moved by name) with wide random weights, so greedy
choices are far from ties. Greedy tokens must be identical for padded encoder inputs (left and
right), end-of-sequence ids that finish rows at different steps (later tokens padded) and all
rows early (a shorter output), a given decoder prompt (the start token put first, as
`transformers` does), with one trace for the whole generation. Whisper's cases are in
`test_whisper.py`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import torch
import transformers
from lm_reference import pair

import treemod.models._generate_seq2seq as generation
from treemod.models.t5 import T5ForConditionalGeneration, generate_seq2seq

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

T5 = {
    "vocab_size": 60,
    "d_model": 16,
    "d_kv": 4,
    "d_ff": 24,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 12,
    "decoder_start_token_id": 0,
    "feed_forward_proj": "gated-gelu",
}


def _t5(config: dict[str, Any] | None = None) -> tuple[Any, Any]:
    hf, model = pair(
        transformers.T5ForConditionalGeneration,
        transformers.T5Config,
        T5ForConditionalGeneration,
        config or T5,
        "eager",
    )
    # Wide weights (moved to the twin by name) spread the logits away from ties.
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.5 * torch.randn_like(p))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for alias in model.tied_weights():
        state.pop(alias, None)
    import treemod as tm

    return hf, tm.load_state_dict(model, state)


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((3, 9), np.int64)
    mask[1, :2] = 0
    mask[2, -3:] = 0
    return rng.integers(2, 60, (3, 9)), mask


def _hf_generate(hf: Any, ids: np.ndarray, mask: np.ndarray, **kwargs: Any) -> np.ndarray:
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            do_sample=False,
            **{
                k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in kwargs.items()
            },
        )
    return out.numpy()


def _finishing_rows_apart(new_tokens: np.ndarray) -> int:
    last = new_tokens.shape[1]
    for token in dict.fromkeys(new_tokens[:, :-1].ravel().tolist()):
        first = [
            int(np.argmax(row == token)) if (row == token).any() else last for row in new_tokens
        ]
        if len(set(first)) > 1:
            return int(token)
    raise AssertionError(f"no token finishes the rows at different steps in {new_tokens}")


def test_t5_greedy_equals_transformers_with_padding_and_eos(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hf, model = _t5()
    run = generation._run.with_max_traces(None)  # its own trace count, starting at zero
    monkeypatch.setattr(generation, "_run", run)
    ids, mask = _inputs()
    plain = _hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    got = generate_seq2seq(model, ids, attention_mask=mask, max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(got), plain)
    eos = [_finishing_rows_apart(plain[:, 1:]), 59]
    want = _hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=58)
    got = generate_seq2seq(
        model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=58
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    assert (want == 58).any(), "the case should pad a finished row"
    # Every row finished early: a shorter output, padded with the first eos id.
    eos = sorted({int(t) for t in plain[:, 2]})
    want = _hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos[0])
    got = generate_seq2seq(model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos)
    assert want.shape[1] <= 3
    np.testing.assert_array_equal(np.asarray(got), want)
    assert run.num_traces == 3  # one per setting: eos ids and pad are static


def test_t5_decoder_prompt_and_untied_head() -> None:
    hf, model = _t5({**T5, "tie_word_embeddings": False, "feed_forward_proj": "relu"})
    ids, mask = _inputs(1)
    prompt = np.array([[7, 8, 9]])  # without the start token: transformers puts it first
    want = _hf_generate(hf, ids, mask, max_new_tokens=6, decoder_input_ids=np.repeat(prompt, 3, 0))
    got = generate_seq2seq(
        model, ids, attention_mask=mask, decoder_input_ids=prompt, max_new_tokens=6
    )
    assert want.shape == (3, 4 + 6)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_sampling_and_refusals() -> None:
    _, model = _t5()
    ids, mask = _inputs()
    greedy = generate_seq2seq(model, ids, attention_mask=mask, max_new_tokens=5)
    top1 = generate_seq2seq(
        model, ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=1,
        key=jax.random.key(0),
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(top1), np.asarray(greedy))
    with pytest.raises(ValueError, match="needs `key=`"):
        generate_seq2seq(model, ids, max_new_tokens=2, do_sample=True)
    with pytest.raises(ValueError, match="does not take input_features"):
        generate_seq2seq(model, ids, input_features=np.zeros((3, 4, 8)), max_new_tokens=2)
    with pytest.raises(
        ValueError, match=r"`suppress_tokens` is \[1.5\]; it must be a token id or a list"
    ):
        generate_seq2seq(model, ids, max_new_tokens=2, suppress_tokens=[1.5])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_seq2seq(model, ids, max_new_tokens=0)
    with pytest.raises(TypeError, match="not an encoder-decoder model"):
        generate_seq2seq(
            object(),
            ids,
            max_new_tokens=2,  # type: ignore[arg-type]
        )
