"""Layer constructors refuse sizes that are not positive ints (bools, floats, zero, negatives)
and keys that are not PRNG keys, naming the class and the argument."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
from treemod import nn

K = jax.random.key(0)

# (class name, argument as named in the error, a constructor taking that argument's value)
SIZES: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("Linear", "in_features", lambda v: nn.Linear(v, 4, key=K)),
    ("Linear", "out_features", lambda v: nn.Linear(3, v, key=K)),
    ("MLP", "in_size", lambda v: nn.MLP(v, 2, 4, 1, key=K)),
    ("MLP", "out_size", lambda v: nn.MLP(3, v, 4, 1, key=K)),
    ("MLP", "width_size", lambda v: nn.MLP(3, 2, v, 1, key=K)),
    ("Conv2d", "in_channels", lambda v: nn.Conv2d(v, 4, 3, key=K)),
    ("Conv2d", "out_channels", lambda v: nn.Conv2d(2, v, 3, key=K)),
    ("Conv2d", "kernel_size", lambda v: nn.Conv2d(2, 4, v, key=K)),
    ("Conv2d", "kernel_size[1]", lambda v: nn.Conv2d(2, 4, (3, v), key=K)),
    ("Conv1d", "stride", lambda v: nn.Conv1d(2, 4, 3, stride=v, key=K)),
    ("Conv1d", "dilation", lambda v: nn.Conv1d(2, 4, 3, dilation=v, key=K)),
    ("Conv1d", "groups", lambda v: nn.Conv1d(2, 4, 3, groups=v, key=K)),
    ("Conv", "num_spatial_dims", lambda v: nn.Conv(v, 2, 4, 3, key=K)),
    ("ConvTranspose1d", "in_channels", lambda v: nn.ConvTranspose1d(v, 4, 3, key=K)),
    ("ConvTranspose1d", "kernel_size", lambda v: nn.ConvTranspose1d(2, 4, v, key=K)),
    ("Embedding", "num_embeddings", lambda v: nn.Embedding(v, 3, key=K)),
    ("Embedding", "embedding_size", lambda v: nn.Embedding(5, v, key=K)),
    ("LayerNorm", "shape", lambda v: nn.LayerNorm(v)),
    ("LayerNorm", "shape[1]", lambda v: nn.LayerNorm((3, v))),
    ("RMSNorm", "shape", lambda v: nn.RMSNorm(v)),
    ("GroupNorm", "groups", lambda v: nn.GroupNorm(v, 4)),
    ("GroupNorm", "channels", lambda v: nn.GroupNorm(2, v)),
    ("BatchNorm", "input_size", lambda v: nn.BatchNorm(v, "batch")),
    ("MultiheadAttention", "num_heads", lambda v: nn.MultiheadAttention(v, 4, key=K)),
    ("MultiheadAttention", "query_size", lambda v: nn.MultiheadAttention(2, v, key=K)),
    ("MultiheadAttention", "qk_size", lambda v: nn.MultiheadAttention(2, 4, qk_size=v, key=K)),
    ("GRUCell", "input_size", lambda v: nn.GRUCell(v, 4, key=K)),
    ("LSTMCell", "hidden_size", lambda v: nn.LSTMCell(3, v, key=K)),
    ("RotaryPositionalEmbedding", "embedding_size", lambda v: nn.RotaryPositionalEmbedding(v)),
    ("MaxPool2d", "kernel_size", lambda v: nn.MaxPool2d(v)),
    ("AvgPool1d", "stride", lambda v: nn.AvgPool1d(2, stride=v)),
    ("AdaptiveAvgPool2d", "target_shape", lambda v: nn.AdaptiveAvgPool2d(v)),
    ("Stack", "num_layers", lambda v: nn.Stack(lambda key: nn.Linear(2, 2, key=key), v, key=K)),
]


@pytest.mark.parametrize("owner, name, make", SIZES, ids=[f"{o}.{n}" for o, n, _ in SIZES])
@pytest.mark.parametrize("bad", [True, False, 0, -2, 2.0, "3"], ids=repr)
def test_sizes_must_be_positive_ints(owner: str, name: str, make: Callable, bad: Any) -> None:
    with pytest.raises(ValueError) as e:
        make(bad)
    msg = str(e.value)
    assert msg.startswith(f"{owner}: `{name}` must be a positive int; got {bad!r}")
    if isinstance(bad, bool):
        assert "a bool is not a size" in msg


@pytest.mark.parametrize("owner, name, make", SIZES, ids=[f"{o}.{n}" for o, n, _ in SIZES])
def test_valid_sizes_still_build(owner: str, name: str, make: Callable) -> None:
    make(2)  # 2 is valid for every argument above (even sizes, divisors of 4)


@pytest.mark.parametrize(
    "owner, name, make, bad",
    [
        ("MLP", "depth", lambda v: nn.MLP(3, 2, 4, v, key=K), -1),
        (
            "ConvTranspose1d",
            "output_padding",
            lambda v: nn.ConvTranspose1d(2, 4, 3, stride=2, output_padding=v, key=K),
            -1,
        ),
        ("GroupNorm", "spatial_ndim", lambda v: nn.GroupNorm(2, 4, spatial_ndim=v), True),
        (
            "SpectralNorm",
            "num_power_iterations",
            lambda v: nn.SpectralNorm(nn.Linear(3, 4, key=K), num_power_iterations=v, key=K),
            1.0,
        ),
    ],
)
def test_sizes_that_may_be_zero(owner: str, name: str, make: Callable, bad: Any) -> None:
    make(0)
    with pytest.raises(ValueError, match=rf"^{owner}: `{name}` must be an int >= 0; got {bad!r}"):
        make(bad)


KEYED: list[tuple[str, Callable[[Any], Any]]] = [
    ("Linear", lambda k: nn.Linear(3, 4, key=k)),
    ("MLP", lambda k: nn.MLP(3, 2, 4, 1, key=k)),
    ("Conv2d", lambda k: nn.Conv2d(2, 4, 3, key=k)),
    ("ConvTranspose2d", lambda k: nn.ConvTranspose2d(2, 4, 3, key=k)),
    ("Embedding", lambda k: nn.Embedding(5, 3, key=k)),
    ("MultiheadAttention", lambda k: nn.MultiheadAttention(2, 4, key=k)),
    ("GRUCell", lambda k: nn.GRUCell(3, 4, key=k)),
    ("LSTMCell", lambda k: nn.LSTMCell(3, 4, key=k)),
    ("Stack", lambda k: nn.Stack(lambda key: nn.Linear(2, 2, key=key), 2, key=k)),
    ("SpectralNorm", lambda k: nn.SpectralNorm(nn.Linear(3, 4, key=K), key=k)),
]


@pytest.mark.parametrize("owner, make", KEYED, ids=[o for o, _ in KEYED])
@pytest.mark.parametrize(
    "bad", [0, 1.5, "seed", jnp.ones(2)], ids=["int", "float", "str", "f32[2]"]
)
def test_keys_must_be_prng_keys(owner: str, make: Callable, bad: Any) -> None:
    with pytest.raises(TypeError) as e:
        make(bad)
    msg = str(e.value)
    assert msg.startswith(f"{owner}: `key` must be a PRNG key") and "jax.random.key(" in msg


@pytest.mark.parametrize("owner, make", KEYED, ids=[o for o, _ in KEYED])
@pytest.mark.parametrize(
    "bad, says",
    [
        (jax.random.split(jax.random.key(0), 2), "must be one PRNG key, got an array of keys"),
        (jax.random.split(jax.random.PRNGKey(0), 2), "uint32 array of shape (2, 2)"),
        (jnp.zeros(5, jnp.uint32), "uint32 array of shape (5,)"),
        (jnp.uint32(7), "uint32 array of shape ()"),
    ],
    ids=["typed batch", "raw batch", "u32[5]", "u32 scalar"],
)
def test_a_batch_of_keys_or_misshapen_key_data_is_refused(
    owner: str, make: Callable, bad: Any, says: str
) -> None:
    with pytest.raises(TypeError) as e:
        make(bad)
    msg = str(e.value)
    assert msg.startswith(f"{owner}: `key` ") and says in msg, msg
    assert "jax.random.key(0)" in msg or f"filter_vmap(lambda k: {owner}(" in msg


def test_layers_built_per_key_under_filter_vmap_still_work() -> None:
    keys = jax.random.split(jax.random.key(0), 3)
    ensemble = tm.filter_vmap(lambda k: nn.Linear(3, 4, key=k))(keys)
    for i in range(3):  # each member is the layer built from its key alone
        one = nn.Linear(3, 4, key=keys[i])
        assert jnp.array_equal(ensemble.weight[i], one.weight)


@pytest.mark.parametrize("owner, make", KEYED, ids=[o for o, _ in KEYED])
def test_both_kinds_of_key_still_work(owner: str, make: Callable) -> None:
    a, b = make(jax.random.key(3)), make(jax.random.PRNGKey(3))  # typed and raw uint32 keys
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert jnp.array_equal(x, y)  # the same key gives the same parameters


# Numeric hyper-parameters that are not sizes: (class, argument, constructor, a valid value,
# the values refused, what the message says the argument must be).
NUMBERS: list[tuple[str, str, Callable[[Any], Any], str]] = [
    ("Dropout", "p", lambda v: nn.Dropout(p=v), "in [0, 1]"),
    (
        "MultiheadAttention",
        "dropout_p",
        lambda v: nn.MultiheadAttention(2, 4, dropout_p=v, key=K),
        "in [0, 1]",
    ),
    ("LayerNorm", "eps", lambda v: nn.LayerNorm(4, eps=v), "a positive number"),
    ("RMSNorm", "eps", lambda v: nn.RMSNorm(4, eps=v), "a positive number"),
    ("GroupNorm", "eps", lambda v: nn.GroupNorm(2, 4, eps=v), "a positive number"),
    ("BatchNorm", "eps", lambda v: nn.BatchNorm(4, eps=v), "a finite number"),
    ("BatchNorm", "momentum", lambda v: nn.BatchNorm(4, momentum=v), "a finite number"),
    (
        "SpectralNorm",
        "eps",
        lambda v: nn.SpectralNorm(nn.Linear(3, 4, key=K), eps=v, key=K),
        "a positive number",
    ),
    (
        "RotaryPositionalEmbedding",
        "theta",
        lambda v: nn.RotaryPositionalEmbedding(4, theta=v),
        "a positive number",
    ),
]
NOT_NUMBERS = [True, False, "0.5", None, float("nan"), float("inf"), [0.5]]


@pytest.mark.parametrize(
    "owner, name, make, want", NUMBERS, ids=[f"{o}.{n}" for o, n, *_ in NUMBERS]
)
@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
def test_numeric_arguments_must_be_real_numbers(
    owner: str, name: str, make: Callable, want: str, bad: Any
) -> None:
    with pytest.raises(ValueError) as e:
        make(bad)
    msg = str(e.value)
    assert msg.startswith(f"{owner}: `{name}` must be {want}; got {bad!r}"), msg
    if isinstance(bad, bool):
        assert "(a bool is not a number here)" in msg
    if isinstance(bad, str):
        assert f"pass the number itself, e.g. {name}=0.5" in msg


@pytest.mark.parametrize(
    "owner, name, make, want", NUMBERS, ids=[f"{o}.{n}" for o, n, *_ in NUMBERS]
)
def test_numeric_arguments_out_of_range(owner: str, name: str, make: Callable, want: str) -> None:
    bads = (
        [-0.1, 1.5] if want == "in [0, 1]" else [0.0, -1.0] if want == "a positive number" else []
    )
    for bad in bads:
        with pytest.raises(ValueError, match=rf"^{owner}: `{name}` must be {re.escape(want)}; got"):
            make(bad)
    make(0.5)  # valid for every argument above, as an int-free float
    make(np.float32(0.5))  # NumPy scalars are numbers too


def test_batch_norm_ranges_keep_their_messages() -> None:
    # BatchNorm's range checks are older than the general one (tests/nn/test_batch_norm.py).
    with pytest.raises(ValueError, match=r"^BatchNorm: momentum must be in \[0, 1\]"):
        nn.BatchNorm(4, momentum=-0.5)
    with pytest.raises(ValueError, match="^BatchNorm: eps must be positive"):
        nn.BatchNorm(4, eps=-1.0)
    with pytest.raises(ValueError, match="PyTorch's momentum=None, a cumulative average, is not"):
        nn.BatchNorm(4, momentum=None)


def test_dropout_takes_concrete_and_traced_array_probabilities() -> None:
    assert nn.Dropout(jnp.float32(0.25)).p == 0.25
    with pytest.raises(ValueError, match=r"^Dropout: `p` must be in \[0, 1\]; got 2.0"):
        nn.Dropout(jnp.float32(2.0))
    # Built under a transform, p is a tracer: it is not checked (and not refused).
    ps = jnp.array([0.1, 0.2])
    layers = tm.filter_vmap(lambda p: nn.Dropout(p))(ps)
    assert jnp.array_equal(layers.p, ps)


def test_probabilities_follow_pytorch() -> None:
    torch = pytest.importorskip("torch")
    for p in (0, 1, 0.0, 0.3, 1.0):  # PyTorch's Dropout accepts these; so does treemod
        torch.nn.Dropout(p)
        nn.Dropout(p)
    for p in (-0.1, 1.5):  # both refuse these
        with pytest.raises(ValueError):
            torch.nn.Dropout(p)
        with pytest.raises(ValueError, match=r"^Dropout: `p` must be in \[0, 1\]"):
            nn.Dropout(p)


# Padding: ints >= 0 or (low, high) pairs; strings only for convolutions.
PADDED: list[tuple[str, Callable[[Any], Any]]] = [
    ("Conv2d", lambda v: nn.Conv2d(2, 4, 3, padding=v, key=K)),
    ("ConvTranspose2d", lambda v: nn.ConvTranspose2d(2, 4, 3, padding=v, key=K)),
    ("MaxPool2d", lambda v: nn.MaxPool2d(3, padding=v)),
    ("AvgPool2d", lambda v: nn.AvgPool2d(3, padding=v)),
]


@pytest.mark.parametrize("owner, make", PADDED, ids=[o for o, _ in PADDED])
@pytest.mark.parametrize(
    "bad, where",
    [
        (True, "padding"),
        (-1, "padding"),
        (1.0, "padding"),
        ((1, -1), "padding[1]"),
        ((1, (0, -2)), "padding[1][1]"),
        ((1, (0, True)), "padding[1][1]"),
    ],
    ids=repr,
)
def test_padding_must_be_ints_at_least_zero(
    owner: str, make: Callable, bad: Any, where: str
) -> None:
    with pytest.raises(ValueError) as e:
        make(bad)
    assert str(e.value).startswith(f"{owner}: `{where}` must be an int >= 0; got "), str(e.value)


@pytest.mark.parametrize("owner, make", PADDED, ids=[o for o, _ in PADDED])
def test_padding_pairs_and_lengths(owner: str, make: Callable) -> None:
    assert make(1).padding == ((1, 1), (1, 1))
    assert make((0, (1, 0))).padding == ((0, 0), (1, 0))
    with pytest.raises(
        ValueError, match=rf"^{owner}: `padding\[0\]` must be an int or a \(low, high\) pair"
    ):
        make(((1, 1, 1), 0))
    with pytest.raises(ValueError, match=rf"^{owner}: `padding` must be an int"):
        make((1, 1, 1))


def test_padding_strings() -> None:
    # PyTorch's spellings 'same' and 'valid' work in any case; pools take no strings.
    assert nn.Conv2d(2, 4, 3, padding="same", key=K).padding == "SAME"
    assert nn.Conv2d(2, 4, 3, padding="Valid", key=K).padding == "VALID"
    with pytest.raises(
        ValueError, match="^Conv2d: string `padding` must be 'SAME', 'SAME_LOWER' or 'VALID'"
    ):
        nn.Conv2d(2, 4, 3, padding="full", key=K)
    with pytest.raises(
        ValueError, match=r"^MaxPool2d: `padding` must be .*\(this layer takes no string"
    ):
        nn.MaxPool2d(3, padding="same")


def test_conv_padding_follows_pytorch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).normal(size=(1, 2, 6, 6)).astype(np.float32)
    for padding in (0, 2, (1, 2), "same", "valid"):  # accepted by both, with the same shapes
        theirs = torch.nn.Conv2d(2, 4, 3, padding=padding)(torch.from_numpy(x)).shape
        ours = nn.Conv2d(2, 4, 3, padding=padding, key=K)(jnp.asarray(x)).shape
        assert tuple(theirs) == ours
    # PyTorch refuses negative padding (when called); treemod when the layer is built.
    with pytest.raises(RuntimeError, match="negative padding"):
        torch.nn.Conv2d(2, 4, 3, padding=-1)(torch.from_numpy(x))
    with pytest.raises(ValueError, match="^Conv2d: `padding` must be an int >= 0"):
        nn.Conv2d(2, 4, 3, padding=-1, key=K)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"], ids=repr)
def test_stack_unroll(bad: Any) -> None:
    make = lambda key: nn.Linear(2, 2, key=key)  # noqa: E731
    with pytest.raises(
        ValueError, match=rf"^Stack: `unroll` must be a positive int; got {re.escape(repr(bad))}"
    ):
        nn.Stack(make, 2, key=K, unroll=bad)
    layers = [make(k) for k in jax.random.split(K, 2)]
    with pytest.raises(ValueError, match=r"^Stack.from_layers: `unroll` must be a positive int"):
        nn.Stack.from_layers(layers, unroll=bad)
    nn.Stack(make, 2, key=K, unroll=True)  # lax.scan's full unroll


@pytest.mark.parametrize(
    "owner, make",
    [
        ("Conv2d", lambda v: nn.Conv2d(2, 4, 3, padding_mode=v, key=K)),
        ("ConvTranspose2d", lambda v: nn.ConvTranspose2d(2, 4, 3, padding_mode=v, key=K)),
    ],
    ids=["Conv2d", "ConvTranspose2d"],
)
@pytest.mark.parametrize("bad", [1, None, True], ids=repr)
def test_padding_mode_must_be_a_string(owner: str, make: Callable, bad: Any) -> None:
    # Was AttributeError: 'int' object has no attribute 'upper'.
    with pytest.raises(ValueError, match=rf"^{owner}: `padding_mode` must be .*; got {bad!r}"):
        make(bad)
    assert make("circular").padding_mode == "CIRCULAR"


@pytest.mark.parametrize("bad", [True, 1.0, "0"], ids=repr)
def test_weight_norm_axis_must_be_an_int_or_none(bad: Any) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^WeightNorm: `axis` must be an int .* or None; got {re.escape(repr(bad))}",
    ):
        nn.WeightNorm(nn.Linear(2, 3, key=K), axis=bad)
    assert nn.WeightNorm(nn.Linear(2, 3, key=K), axis=None).axis is None


def test_dropout_takes_an_array_of_probabilities() -> None:
    # An array p broadcast against the input (as before); each value must be in [0, 1].
    assert nn.Dropout(jnp.array([0.0, 0.5])).p.shape == (2,)
    with pytest.raises(
        ValueError, match=r"^Dropout: `p` must be in \[0, 1\]; got an array of shape \(2,\)"
    ):
        nn.Dropout(jnp.array([0.5, 1.5]))
    with pytest.raises(
        ValueError, match=r"^Dropout: `p` must be in \[0, 1\]; got an array of shape \(2,\)"
    ):
        nn.Dropout(jnp.array([0.5, jnp.nan]))
