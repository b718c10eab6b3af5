"""GPT-2 (`GPT2Model`, `GPT2LMHeadModel`) against `transformers`' own, weights moved with
`tm.load_state_dict`: float32 outputs within 1e-5 relative, padded batches, every config value
the class reads (a hypothesis test over them), and the refused values named in the error."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import RTOL, hf_output, padded_batch, pair, relative_error, run

import treemod as tm
from treemod.models._hf_activations import ACTIVATIONS
from treemod.models.gpt2 import GPT2LMHeadModel, GPT2Model

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

BASE = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 32}
HF = {GPT2Model: transformers.GPT2Model, GPT2LMHeadModel: transformers.GPT2LMHeadModel}


def _pair(cls: Any, config: dict[str, Any], attn: str = "sdpa") -> tuple[Any, Any]:
    return pair(HF[cls], transformers.GPT2Config, cls, config, attn)


@pytest.mark.parametrize("cls", [GPT2Model, GPT2LMHeadModel])
def test_padded_batch_matches_transformers(cls: Any) -> None:
    # transformers' default (SDPA) attention: its outputs at padded positions depend on the
    # attention implementation, so only the tokens are compared there.
    hf, model = _pair(cls, BASE)
    ids, mask = padded_batch(100)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    got = run(model, {"input_ids": ids, "attention_mask": mask})
    assert relative_error(got, want, keep=mask) <= RTOL
    # Eagerly too, without a mask.
    assert relative_error(model(input_ids=ids), hf_output(hf, input_ids=ids)) <= RTOL


def test_padded_positions_match_eager_attention() -> None:
    # transformers' eager attention masks with float32's lowest value, as treemod does: then
    # even the padded positions agree.
    hf, model = _pair(GPT2LMHeadModel, BASE, attn="eager")
    ids, mask = padded_batch(100)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    assert relative_error(run(model, {"input_ids": ids, "attention_mask": mask}), want) <= RTOL


def test_positions_token_types_and_jit() -> None:
    hf, model = _pair(GPT2Model, {**BASE, "use_cache": False})
    ids, _ = padded_batch(100, batch=2, seq=6)
    types = np.array([[0, 0, 1, 1, 2, 2], [3, 3, 3, 0, 0, 0]])
    # A jump in the positions starts a packed sequence (the config's use_cache is off).
    positions = np.array([[0, 1, 2, 0, 1, 2], [4, 5, 6, 7, 8, 9]])
    inputs = {"input_ids": ids, "token_type_ids": types, "position_ids": positions}
    want = hf_output(hf, **inputs)
    assert relative_error(model(**inputs), want) <= RTOL
    jitted = tm.filter_jit(lambda m, i, t, p: m(input_ids=i, token_type_ids=t, position_ids=p))
    assert relative_error(jitted(model, ids, types, positions), want) <= RTOL


@settings(max_examples=6)
@given(
    heads_and_dim=st.sampled_from([(1, 16), (2, 32), (4, 32), (8, 64)]),
    n_layer=st.integers(1, 2),
    n_inner=st.sampled_from([None, 24, 80]),
    activation=st.sampled_from(sorted(ACTIVATIONS)),
    scale_attn_weights=st.booleans(),
    inverse_layer_idx=st.booleans(),
    upcast=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3]),
    tie=st.booleans(),
)
def test_config_values_match_transformers(
    heads_and_dim: tuple[int, int],
    n_layer: int,
    n_inner: int | None,
    activation: str,
    scale_attn_weights: bool,
    inverse_layer_idx: bool,
    upcast: bool,
    eps: float,
    tie: bool,
) -> None:
    heads, dim = heads_and_dim
    config = {
        "n_embd": dim,
        "n_head": heads,
        "n_layer": n_layer,
        "n_inner": n_inner,
        "vocab_size": 50,
        "n_positions": 16,
        "activation_function": activation,
        "scale_attn_weights": scale_attn_weights,
        "scale_attn_by_inverse_layer_idx": inverse_layer_idx,
        "reorder_and_upcast_attn": upcast,
        "layer_norm_epsilon": eps,
        "tie_word_embeddings": tie,
    }
    hf, model = _pair(GPT2LMHeadModel, config, attn="eager")
    assert (model.lm_head is None) == tie
    ids, mask = padded_batch(50, batch=2, seq=5)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    assert relative_error(run(model, {"input_ids": ids, "attention_mask": mask}), want) <= RTOL


@pytest.mark.parametrize(
    "change, key",
    [
        ({"add_cross_attention": True}, "add_cross_attention"),
        ({"activation_function": "prelu"}, "activation_function"),
        ({"activation_function": "xielu"}, "activation_function"),
        ({"activation_function": "gelu_fancy"}, "activation_function"),
        ({"n_head": 5}, "n_head"),
        ({"is_causal": False}, "is_causal"),
        ({"n_layer": 0}, "n_layer"),
        ({"attn_pdrop": 1.5}, "attn_pdrop"),
    ],
)
@pytest.mark.parametrize("cls", [GPT2Model, GPT2LMHeadModel])
def test_refused_config_values_are_named(cls: Any, change: dict[str, Any], key: str) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**BASE, **change}, key=jax.random.key(0))
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}: config value {key}=")
    assert "not supported" in message


def test_dropout_in_training_mode() -> None:
    # Built in inference mode (transformers' from_pretrained gives an eval() model); in
    # training mode each dropout draws from the call's key.
    config = {**BASE, "resid_pdrop": 0.3, "embd_pdrop": 0.3, "attn_pdrop": 0.3}
    hf, model = _pair(GPT2LMHeadModel, config)
    ids, _ = padded_batch(100, batch=2, seq=5)
    assert relative_error(model(input_ids=ids), hf_output(hf, input_ids=ids)) <= RTOL
    training = tm.nn.inference_mode(model, False)
    with pytest.raises(RuntimeError, match="Dropout needs a `key`"):
        training(input_ids=ids)
    a, b, c = (run(training, {"input_ids": ids, "key": jax.random.key(k)}) for k in (1, 1, 2))
    assert jnp.array_equal(a, b) and not jnp.array_equal(a, c)
    assert not jnp.allclose(a, model(input_ids=ids))
    # With every probability 0, training mode computes transformers' (eval) outputs.
    no_drop = {**BASE, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    hf0, model0 = _pair(GPT2LMHeadModel, no_drop)
    out = run(tm.nn.inference_mode(model0, False), {"input_ids": ids, "key": jax.random.key(0)})
    assert relative_error(out, hf_output(hf0, input_ids=ids)) <= RTOL


def test_skeleton_and_names() -> None:
    # from_config traces under filter_eval_shape (loading builds a shape-only skeleton), and
    # the state dict names are transformers' (the tied head is an alias, not a second array).
    skeleton = tm.filter_eval_shape(
        lambda: GPT2LMHeadModel.from_config(BASE, key=jax.random.key(0))
    )
    assert skeleton.transformer.h.layers.attn.c_attn.weight.shape == (2, 32, 96)
    names = set(tm.state_dict(GPT2LMHeadModel.from_config(BASE, key=jax.random.key(0))))
    hf_names = set(transformers.GPT2LMHeadModel(transformers.GPT2Config(**BASE)).state_dict())
    assert names == hf_names - {"lm_head.weight"}


def test_bad_inputs_are_named() -> None:
    model = GPT2Model.from_config(BASE, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"GPT2Model: `input_ids` must be integer token ids"):
        model(input_ids=np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"GPT2Model: `attention_mask` must have the shape"):
        model(input_ids=np.zeros((2, 4), np.int32), attention_mask=np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"GPT2Model: `position_ids` must be integers"):
        model(input_ids=np.zeros((2, 4), np.int32), position_ids=np.zeros((3, 4), np.int32))
