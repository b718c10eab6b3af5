"""Attention as one function, and what the language models share: their inputs and masks.

`attend(q, k, v, mask, scale=...)` is the whole of attention once the projections are done,
for every family (mask or bias, soft-capping, grouped-query heads): a key-value cache (prefill,
then one token per step) threads in by giving it longer `k`, `v` and the matching mask. Masks
are boolean `(batch, 1, q_len, kv_len)` (True where a query may attend), built as
`transformers`' `create_causal_mask` builds them: causal, optionally within a sliding window,
and either padded (a 2-D `attention_mask`) or split into the packed sequences that explicit
`position_ids` without a mask describe.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._sharding.constrain import active_axis_rules, constrain

__all__ = ["attend", "causal_mask", "token_inputs", "split_key", "projection_keys", "unwrapped"]


def token_inputs(
    owner: str, input_ids: Any, attention_mask: Any, position_ids: Any
) -> tuple[Array, Array | None, Array | None]:
    """Check and convert a language model's inputs (NumPy or JAX arrays, as Hugging Face's).

    Arguments:
        owner: the model class, for messages.
        input_ids: integer token ids `(batch, seq)`.
        attention_mask: `None` or `(batch, seq)`, nonzero where a token is real (padding 0).
        position_ids: `None` or `(batch, seq)` / `(1, seq)` integer positions.

    Returns:
        `(input_ids, attention_mask, position_ids)` as JAX arrays (the last two may be `None`),
        the mask boolean (nonzero is a token, of any dtype, as `transformers` reads it),
        `position_ids` broadcast to `(batch, seq)`.
    """
    if input_ids is None:
        raise ValueError(f"{owner}: pass `input_ids=` (integer token ids of shape (batch, seq)).")
    ids = jnp.asarray(input_ids)
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(
            f"{owner}: `input_ids` must be integer token ids of shape (batch, seq); got "
            f"{ids.dtype}{list(ids.shape)}. Add a batch axis with input_ids[None] for one sequence."
        )
    mask = None
    if attention_mask is not None:
        mask = jnp.asarray(attention_mask)
        if mask.shape != ids.shape:
            raise ValueError(
                f"{owner}: `attention_mask` must have the shape of `input_ids` {list(ids.shape)} "
                f"(1 for real tokens, 0 for padding); got {list(mask.shape)}. Prepared 4-D masks "
                "and masks longer than the input (a cache's) are not accepted."
            )
        mask = mask.astype(bool)
    positions = None
    if position_ids is not None:
        positions = jnp.asarray(position_ids)
        if positions.ndim == 1:
            positions = positions[None]
        if (
            positions.ndim != 2
            or positions.shape[1] != ids.shape[1]
            or positions.shape[0] not in (1, ids.shape[0])
            or not jnp.issubdtype(positions.dtype, jnp.integer)
        ):
            raise ValueError(
                f"{owner}: `position_ids` must be integers of shape (batch, seq) or (1, seq) "
                f"matching `input_ids` {list(ids.shape)}; got {positions.dtype}"
                f"{list(positions.shape)}."
            )
        positions = jnp.broadcast_to(positions, ids.shape)
    return ids, mask, positions


def causal_mask(
    seq_len: int,
    attention_mask: Array | None = None,
    position_ids: Array | None = None,
    sliding_window: int | None = None,
) -> Array:
    """The boolean attention mask `transformers`' `create_causal_mask` builds (True: attend).

    Query `i` attends to key `j <= i` (and `j > i - sliding_window` with a window). A 2-D
    `attention_mask` removes the padded keys. Without one, explicit `position_ids` describe
    packed sequences as `transformers` reads them: a new sequence starts wherever the position
    does not grow by one, and queries attend only within their own sequence.

    Arguments:
        seq_len: the number of queries and keys.
        attention_mask: `None` or `(batch, seq_len)`, nonzero for real tokens.
        position_ids: `None` or `(batch, seq_len)`, used only when `attention_mask` is `None`.
        sliding_window: `None`, or the number of most recent keys (the query's own included)
            each query sees.

    Returns:
        `(batch or 1, 1, seq_len, seq_len)` booleans.

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod.models._attention_parts import causal_mask
        >>> causal_mask(3, jnp.array([[0, 1, 1]]))[0, 0].astype(int)
        Array([[0, 0, 0],
               [0, 1, 0],
               [0, 1, 1]], dtype=int32)
    """
    # A symbolic length under jax.export too; lax.iota, since jax2onnx's jnp.arange takes none.
    index = jax.lax.iota(jnp.int32, seq_len)
    allowed = index[None, :] <= index[:, None]
    if sliding_window is not None:
        allowed &= index[None, :] > index[:, None] - sliding_window
    mask = allowed[None, None]
    if attention_mask is not None:
        return mask & attention_mask.astype(bool)[:, None, None, :]
    if position_ids is not None:
        # transformers' find_packed_sequence_indices: with no jump anywhere every token is in
        # sequence 0 and this changes nothing, so it applies unconditionally.
        first = position_ids[:, :1] - 1
        previous = jnp.concatenate([first, position_ids[:, :-1]], axis=1)
        sequence = jnp.cumsum((position_ids - previous) != 1, axis=1)
        return mask & (sequence[:, None, :, None] == sequence[:, None, None, :])
    return mask


def attend(
    q: Array,
    k: Array,
    v: Array,
    mask: Array | None,
    *,
    scale: float | Array,
    bias: Array | None = None,
    softcap: float | None = None,
    dropout: nn.Dropout | None = None,
    key: PRNGKeyArray | None = None,
    scores: str = "float32",
) -> Array:
    """Scaled dot-product attention with grouped-query heads, as `transformers`' eager attention.

    The one attention of the zoo. `scores = (q @ k^T) * scale`, soft-capped
    (`softcap * tanh(scores / softcap)`) when asked, plus `bias`; masked positions set to the
    lowest float (as `transformers`' eager masks do, so a query with no key to attend, a padded
    one, averages all values rather than giving NaN); a float32 softmax, dropout on the
    probabilities, then the weighted sum of values. Query head `h` reads key-value head
    `h // (heads // kv_heads)`. Sliding windows and causality are in `mask` (`causal_mask`, a
    cache's `mask`). Without active dropout or soft-capping, with a number `scale`, float32
    scores and as many key-value heads as query heads, this is `jax.nn.dot_product_attention`
    (the same numbers).

    Arguments:
        q: queries `(batch, q_len, heads, head_dim)`.
        k: keys `(batch, kv_len, kv_heads, head_dim)`; `kv_heads` divides `heads`.
        v: values `(batch, kv_len, kv_heads, head_dim)`.
        mask: `None` or booleans broadcasting to `(batch, 1, q_len, kv_len)`, True to attend.
        scale: the factor on the scores (a number, or a scalar array).
        bias: `None` or an additive bias `(batch or 1, heads or 1, q_len or 1, kv_len)`.
        softcap: `None`, or the soft cap of the scores.
        dropout: dropout on the probabilities (identity in inference mode).
        key: the dropout key.
        scores: `"float32"`: `q @ k^T` accumulated in float32; `"float32_inputs"`: q and k
            made float32 first (GPT-2's `reorder_and_upcast_attn`); `"input"`: `q @ k^T` and its
            scaling in the inputs' dtype, then made float32 at least (BERT's, ViT's).

    Returns:
        `(batch, q_len, heads, head_dim)` in `v`'s dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod.models._attention_parts import attend
        >>> q = jnp.ones((1, 3, 4, 8)); kv = jnp.ones((1, 3, 2, 8))
        >>> attend(q, kv, kv, None, scale=8**-0.5).shape
        (1, 3, 4, 8)
    """
    if active_axis_rules() is not None:  # under `tm.axis_rules`: split by heads
        q, k, v = (constrain(t, ("batch", None, "heads", None)) for t in (q, k, v))
    # jax.nn.dot_product_attention runs grouped heads in another order (other last bits).
    same_heads = q.shape[2] == k.shape[2] and q.dtype == k.dtype == v.dtype
    float32 = scores == "float32" or q.dtype == jnp.float32
    plain = softcap is None and not _drops(dropout) and isinstance(scale, int | float)
    # jax.nn.dot_product_attention refuses a bias of another dtype than q (a float32 bias with
    # bfloat16 inputs): that case is computed below.
    plain = plain and (bias is None or bias.dtype == q.dtype)
    if plain and same_heads and float32:
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=float(scale))
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    qg = q.reshape(batch, q_len, kv_heads, groups, head_dim)
    if scores == "float32_inputs":
        qg, k = qg.astype(jnp.float32), k.astype(jnp.float32)
    if scores == "input":
        s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k) * jnp.asarray(scale, q.dtype)
        s = s.astype(jnp.float32 if jnp.finfo(s.dtype).bits < 32 else s.dtype)
    else:
        s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32)
        s = s * scale
    if softcap is not None:
        s = jnp.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + _grouped(bias, kv_heads).astype(s.dtype)
    if mask is not None:
        s = jnp.where(_grouped(mask, kv_heads), s, jnp.finfo(s.dtype).min)
    probs = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    if dropout is not None:
        probs = dropout(probs, key=key)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(batch, q_len, heads, head_dim)


def _drops(dropout: nn.Dropout | None) -> bool:
    """Whether `dropout` may drop anything (not in inference mode, `p` not zero)."""
    if dropout is None or dropout.inference:
        return False
    return not (isinstance(dropout.p, int | float) and dropout.p == 0)


def _grouped(x: Array, kv_heads: int) -> Array:
    """A `(batch, heads or 1, q, k)` mask or bias as `(batch, kv_heads or 1, groups or 1, q, k)`."""
    if x.ndim < 4 or x.shape[1] == 1:
        return jnp.expand_dims(x, -3)
    return x.reshape(x.shape[0], kv_heads, x.shape[1] // kv_heads, *x.shape[2:])


def split_key(key: PRNGKeyArray | None, n: int) -> list[PRNGKeyArray | None]:
    """`n` keys from `key` (for the dropouts of one layer), or `n` times `None` without one."""
    if key is None:
        return [None] * n
    return list(jax.random.split(key, n))


# Folded into a layer's key before its projections' keys are split, so that those keys are
# independent of the layer's own dropout keys (`split_key(key, n)`), which stay as they were.
_PROJECTIONS = 0x10_4A


def projection_keys(
    key: PRNGKeyArray | None, n: int, *, stream: int = 0
) -> list[PRNGKeyArray | None]:
    """`n` keys for the projections of one layer, or `n` times `None` without a key.

    A zoo layer passes them as `key=` to each `nn.Linear` / `nn.Conv` it calls (which ignore
    them), so that the layers `treemod.lora.add_lora` wraps get a dropout key each. They are
    drawn from `fold_in(key, ...)`, so the layer's other dropout keys (`split_key(key, m)`)
    are unchanged and independent of them; without a key nothing is traced. A layer that
    passes its `key` itself to a child that draws projection keys from it draws its own from
    another `stream` (else the two would share keys).

    Arguments:
        key: the layer's key, or `None` (inference, or no dropout).
        n: how many projections the layer calls.
        stream: which independent set of keys (0, 1, ...).

    Returns:
        A list of `n` keys, or of `n` times `None`.

    Example:
        >>> import jax
        >>> from treemod.models._attention_parts import projection_keys
        >>> projection_keys(None, 2)
        [None, None]
        >>> len(projection_keys(jax.random.key(0), 3))
        3
    """
    if key is None:
        return [None] * n
    return list(jax.random.split(jax.random.fold_in(key, _PROJECTIONS + stream), n))


def unwrapped(layer: Any) -> Any:
    """The layer itself, or the one a LoRA adapter wraps (`treemod.lora`'s `base_layer`), for
    reading its weight's dtype and its sizes.

    Example:
        >>> import jax, treemod.nn as nn
        >>> from treemod.models._attention_parts import unwrapped
        >>> conv = nn.Conv2d(3, 4, 2, key=jax.random.key(0))
        >>> unwrapped(conv) is conv
        True
    """
    return getattr(layer, "base_layer", layer)
