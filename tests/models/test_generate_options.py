"""`generate`'s options against `transformers`' `generate` and logits processors.

The checkpoint's generation config (end-of-sequence ids in `generation_config.json`, refused
values), the processors (repetition penalty, `min_new_tokens`, suppressed tokens), scores,
length buckets, several sequences per prompt, per-row keys and the streamer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import pair
from test_generate import CASES, hf_generate, prompts
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import treemod.models._generate as generation
from treemod.models import PretrainedConfig, from_pretrained, generate, save_pretrained
from treemod.models._generation_config import generation_settings
from treemod.models._sampling import process, warp


def padded_prompts(lengths: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`prompts`, the padding holding each row's first token: transformers before 5.13
    penalised the padding's ids too, and later ones do not (nor treemod); with ids the row holds
    anyway, both penalise the same tokens."""
    ids, mask = prompts(lengths, seed)
    first = ids[np.arange(len(ids)), np.argmax(mask, axis=1)]
    return np.where(mask == 1, ids, first[:, None]), mask


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any]:
    return pair(*CASES["llama"][:3], CASES["llama"][3])


def test_eos_ids_of_generation_config_json_stop_as_in_transformers(tmp_path: Path) -> None:
    hf, _ = pair(*CASES["llama"][:3], CASES["llama"][3])
    ids, mask = prompts((3, 6), seed=1)
    plain = hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    eos = sorted({int(plain[0, 6 + 1]), int(plain[1, 6 + 3])})  # every row done by step 3
    hf.generation_config = transformers.GenerationConfig(
        eos_token_id=eos, pad_token_id=eos[0], max_new_tokens=12
    )
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    assert model.config.generation is not None
    want = hf_generate(hf, ids, mask)  # everything from the generation config
    got = generate(model, ids, attention_mask=mask)
    assert want.shape[1] < 6 + 12
    np.testing.assert_array_equal(np.asarray(got), want)
    # save_pretrained writes the generation config back, as transformers reads it.
    save_pretrained(model, tmp_path / "again")
    back = transformers.GenerationConfig.from_pretrained(tmp_path / "again")
    assert back.eos_token_id == eos and back.max_new_tokens == 12


def test_without_generation_config_json_the_config_ids_apply(tmp_path: Path) -> None:
    hf, _ = pair(*CASES["gpt2"][:3], CASES["gpt2"][3])
    ids, mask = prompts((4, 4), seed=2)
    plain = hf_generate(hf, ids, mask, max_new_tokens=8, eos_token_id=None, pad_token_id=0)
    hf.config.eos_token_id = int(plain[0, 4 + 2])
    hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()  # config's ids only
    model = from_pretrained(tmp_path)
    assert model.config.generation is None
    want = hf_generate(hf, ids, mask, max_new_tokens=8, pad_token_id=7)
    got = generate(model, ids, attention_mask=mask, max_new_tokens=8, pad_token_id=7)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert (want[0, 4 + 3 :] == 7).all()


def test_a_generation_config_value_treemod_lacks_is_refused_by_file(tmp_path: Path) -> None:
    hf, _ = pair(*CASES["gpt2"][:3], CASES["gpt2"][3])
    hf.generation_config = transformers.GenerationConfig(num_beams=4, eos_token_id=3)
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    ids = np.array([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"generation_config\.json key 'num_beams' is 4"):
        generate(model, ids, max_new_tokens=3)
    got = generate(model, ids, max_new_tokens=3, generation_config={})  # the documented way out
    assert got.shape == (1, 6)


@pytest.mark.parametrize(
    "options",
    [
        {"repetition_penalty": 1.8},
        {"repetition_penalty": 0.7, "min_new_tokens": 4},
        {"suppress_tokens": [5, 17, 42], "begin_suppress_tokens": [1, 2, 3]},
    ],
    ids=["penalty", "reward-and-min-new", "suppress"],
)
def test_greedy_with_processors_equals_transformers(llama: Any, options: dict[str, Any]) -> None:
    hf, model = llama
    ids, mask = padded_prompts((2, 5, 7), seed=3)
    plain = hf_generate(hf, ids, mask, max_new_tokens=10, eos_token_id=None, pad_token_id=0)
    eos = int(plain[1, 7 + 1])  # would finish row 1 at its second token, before min_new_tokens
    kwargs = {"max_new_tokens": 10, "eos_token_id": eos, "pad_token_id": 99, **options}
    want = hf_generate(hf, ids, mask, **kwargs)
    got = generate(model, ids, attention_mask=mask, **kwargs)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_scores_equal_transformers_transition_scores(llama: Any) -> None:
    hf, model = llama
    ids, mask = padded_prompts((3, 6), seed=4)
    kwargs = {"max_new_tokens": 6, "repetition_penalty": 1.3, "pad_token_id": 0}
    with torch.no_grad():
        out = hf.generate(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    want = hf.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    got = generate(model, ids, attention_mask=mask, output_scores=True, **kwargs)
    np.testing.assert_array_equal(np.asarray(got.sequences), out.sequences.numpy())
    np.testing.assert_allclose(np.asarray(got.scores), want.numpy(), atol=2e-4)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    penalty=st.sampled_from([1.0, 0.8, 1.5]),
    min_new=st.integers(0, 3),
    generated=st.integers(0, 4),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    top_k=st.sampled_from([0, 1, 5, 50]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    min_p=st.sampled_from([None, 0.05, 0.5]),
)
def test_processors_and_warpers_equal_transformers(
    seed: int,
    penalty: float,
    min_new: int,
    generated: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float | None,
) -> None:
    rng = np.random.default_rng(seed)
    vocab, prompt_len = 40, 5
    logits = rng.normal(0, 2, (3, vocab)).astype(np.float32)
    ids = rng.integers(0, vocab, (3, prompt_len + generated))
    eos = [3, 7]
    call = {
        "max_new_tokens": 8,
        "do_sample": True,
        "repetition_penalty": penalty,
        "min_new_tokens": min_new,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "eos_token_id": eos,
        "suppress_tokens": [11],
        "begin_suppress_tokens": [12],
    }
    s = generation_settings(
        "test",
        PretrainedConfig({}),
        call,
        generation_config={},
        prompt_len=prompt_len,
        vocab_size=vocab,
    )
    seen = np.zeros((3, vocab), bool)
    np.put_along_axis(seen, ids, True, axis=1)
    got = warp(process(jnp.asarray(logits), s, jnp.asarray(seen), jnp.int32(generated)), s)
    chain: list[Any] = [
        RepetitionPenaltyLogitsProcessor(penalty),
        MinNewTokensLengthLogitsProcessor(prompt_len, min_new, eos),
        SuppressTokensLogitsProcessor([11]),
        SuppressTokensAtBeginLogitsProcessor([12], prompt_len),
        TemperatureLogitsWarper(temperature),
    ]
    if top_k:
        chain.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p))
    if min_p is not None:
        chain.append(MinPLogitsWarper(min_p))
    want = LogitsProcessorList(chain)(torch.from_numpy(ids), torch.from_numpy(logits)).numpy()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(np.asarray(got)[finite], want[finite], rtol=1e-5, atol=1e-6)


def test_length_buckets_compile_once_and_change_no_token(
    llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model = llama
    run = generation._run.with_max_traces(None)
    monkeypatch.setattr(generation, "_run", run)
    outputs = []
    for width in (3, 5, 8):
        ids, mask = prompts((width, width - 1), seed=width)
        bucketed = generate(
            model,
            ids,
            attention_mask=mask,
            max_new_tokens=5,
            pad_to_multiple_of=8,
            repetition_penalty=1.2,
        )
        outputs.append((ids, mask, bucketed))
    assert run.num_traces == 1
    for ids, mask, bucketed in outputs:
        plain = generate(model, ids, attention_mask=mask, max_new_tokens=5, repetition_penalty=1.2)
        np.testing.assert_array_equal(np.asarray(bucketed), np.asarray(plain))


def test_per_row_keys_make_a_row_independent_of_its_batch(llama: Any) -> None:
    _, model = llama
    ids, mask = prompts((4, 4, 4), seed=5)
    keys = jax.random.split(jax.random.key(7), 3)
    kwargs: dict[str, Any] = {"max_new_tokens": 6, "do_sample": True, "top_k": 0}
    batch = generate(model, ids, attention_mask=mask, key=keys, **kwargs)
    alone = generate(model, ids[1:2], attention_mask=mask[1:2], key=keys[1:2], **kwargs)
    np.testing.assert_array_equal(np.asarray(batch[1:2]), np.asarray(alone))
    again = generate(model, ids, attention_mask=mask, key=keys, **kwargs)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(batch))


def test_num_return_sequences_gives_consecutive_rows_per_prompt(llama: Any) -> None:
    _, model = llama
    ids, mask = prompts((2, 4), seed=6)
    out = generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=True,
        num_return_sequences=3,
        temperature=2.0,
        key=jax.random.key(0),
    )
    out = np.asarray(out)
    assert out.shape == (6, 4 + 8)
    np.testing.assert_array_equal(out[:, :4], np.repeat(ids, 3, axis=0))
    assert len({tuple(r) for r in out[:3, 4:]}) > 1, "samples of one prompt should differ"


def test_the_streamer_receives_the_prompt_then_each_token(llama: Any) -> None:
    _, model = llama
    ids, mask = prompts((3, 5), seed=7)

    class Recorder:
        def __init__(self) -> None:
            self.puts: list[np.ndarray] = []
            self.ended = False

        def put(self, value: np.ndarray) -> None:
            self.puts.append(np.array(value))

        def end(self) -> None:
            self.ended = True

    recorder = Recorder()
    out = np.asarray(generate(model, ids, attention_mask=mask, max_new_tokens=6, streamer=recorder))
    np.testing.assert_array_equal(recorder.puts[0], ids)
    np.testing.assert_array_equal(np.stack(recorder.puts[1:], axis=1), out[:, 5:])
    assert recorder.ended
    with pytest.raises(TypeError, match="`streamer` must have put"):
        generate(model, ids, attention_mask=mask, max_new_tokens=2, streamer=print)


def test_a_damaged_generation_config_json_is_named(tmp_path: Path) -> None:
    hf, _ = pair(*CASES["gpt2"][:3], CASES["gpt2"][3])
    hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(Exception, match=r"generation_config\.json holds a list"):
        from_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": "x"}))
    model = from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"generation_config\.json key 'top_k' is 'x'"):
        generate(model, np.array([[1, 2]]), max_new_tokens=2, do_sample=True, key=jax.random.key(0))
