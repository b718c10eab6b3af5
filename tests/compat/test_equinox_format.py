"""Equinox's checkpoint format: treemod writes the bytes real Equinox writes, reads Equinox's files
into treemod's layers (converting the layouts that differ), and Equinox reads treemod's files.

Every reference here is real Equinox (`eqx.tree_serialise_leaves`, Equinox's layers and their
outputs); the module is skipped where Equinox is not installed.
"""

from __future__ import annotations

import functools
import io
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.compat.equinox as ceqx

from helpers import close

eqx = pytest.importorskip("equinox")

KEY = jax.random.PRNGKey(0)


def _eqx_bytes(tree: Any, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, tree, **kwargs)
    return buf.getvalue()


def _tm_bytes(tree: Any, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    ceqx.tree_serialise_leaves(buf, tree, **kwargs)
    return buf.getvalue()


def _noisy(tree: Any, seed: int) -> Any:
    """`tree` with every float array moved by random noise (so ones/zeros inits are not trivial)."""
    leaves, treedef = jtu.tree_flatten(tree)
    rng = np.random.default_rng(seed)
    out = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.floating):
            leaf = leaf + jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)
        out.append(leaf)
    return jtu.tree_unflatten(treedef, out)


# Byte-identical files for plain trees.

_DTYPES = [
    jnp.bool_,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.uint8,
    jnp.uint32,
    jnp.float16,
    jnp.bfloat16,
    jnp.float32,
    jnp.complex64,
]


def _array(dtype: Any, shape: tuple[int, ...], seed: int) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=shape) * 5).astype(dtype)


_leaf = st.one_of(
    st.builds(
        _array,
        st.sampled_from(_DTYPES),
        st.lists(st.integers(0, 3), max_size=3).map(tuple),
        st.integers(0, 9),
    ),
    st.builds(lambda s: np.arange(s, dtype=np.float64), st.integers(0, 4)),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.none(),
    st.just("a string"),
    st.just(jnp.tanh),
    st.builds(np.float32, st.floats(-10, 10, width=32)),
)
_trees = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcd"), children, max_size=3),
    ),
    max_leaves=8,
)


@settings(deadline=None)
@given(_trees)
def test_plain_trees_give_equinox_bytes_and_round_trip(tree: Any) -> None:
    data = _tm_bytes(tree)
    assert data == _eqx_bytes(tree)
    back = ceqx.tree_deserialise_leaves(io.BytesIO(data), tree)
    assert eqx.tree_equal(back, eqx.tree_deserialise_leaves(io.BytesIO(data), tree))


class _Net(tm.Module):
    """A user's module with a static field and nested modules."""

    layers: list
    scale: float
    name: str = tm.field(static=True)


def test_nested_modules_and_static_fields() -> None:
    net = _Net([tm.nn.Linear(2, 3, key=jax.random.key(1)), jnp.arange(3)], 0.5, "n")
    assert _tm_bytes(net) == _eqx_bytes(net)
    like = _Net([tm.nn.Linear(2, 3, key=jax.random.key(2)), jnp.zeros(3, jnp.int32)], 0.0, "n")
    back = ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes(net)), like)
    assert tm.tree_equal(back, net)


def test_suffix_added_as_equinox_does(tmp_path: pathlib.Path) -> None:
    tree = {"w": jnp.arange(4.0)}
    ceqx.tree_serialise_leaves(tmp_path / "model", tree)
    ceqx.tree_serialise_leaves(str(tmp_path / "other.bin"), tree)
    eqx.tree_serialise_leaves(tmp_path / "ref", tree)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.eqx", "other.bin", "ref.eqx"]
    assert (tmp_path / "model.eqx").read_bytes() == (tmp_path / "ref.eqx").read_bytes()
    # Both libraries read the suffixless name back from the `.eqx` file.
    assert tm.tree_equal(ceqx.tree_deserialise_leaves(tmp_path / "model", tree), tree)
    assert tm.tree_equal(eqx.tree_deserialise_leaves(tmp_path / "model", tree), tree)


def test_file_objects_hold_several_trees_in_sequence() -> None:
    buf = io.BytesIO()
    ceqx.tree_serialise_leaves(buf, [jnp.ones(2)])
    ceqx.tree_serialise_leaves(buf, (3, 4.5))
    buf.seek(0)
    assert tm.tree_equal(ceqx.tree_deserialise_leaves(buf, [jnp.zeros(2)]), [jnp.ones(2)])
    assert ceqx.tree_deserialise_leaves(buf, (0, 0.0)) == (3, 4.5)


def test_custom_filter_spec_and_is_leaf_as_equinox() -> None:
    tree = (jnp.array([1, 2, 3]), [4, 5, 6], {"k": jnp.ones(2)})

    def skip_arrays(f: Any, x: Any) -> None:
        if not isinstance(x, jax.Array):
            ceqx.default_serialise_filter_spec(f, x)

    assert _tm_bytes(tree, filter_spec=skip_arrays) == _eqx_bytes(tree, filter_spec=skip_arrays)
    # A tree of specs, a prefix of the tree.
    specs = (ceqx.default_serialise_filter_spec, skip_arrays, ceqx.default_serialise_filter_spec)
    assert _tm_bytes(tree, filter_spec=specs) == _eqx_bytes(tree, filter_spec=specs)

    # is_leaf: the whole list goes to the spec as one leaf.
    def whole_list(f: Any, x: Any) -> None:
        np.save(f, np.asarray(x) if isinstance(x, list) else x)

    is_list = lambda x: isinstance(x, list)  # noqa: E731
    assert _tm_bytes(tree, filter_spec=whole_list, is_leaf=is_list) == _eqx_bytes(
        tree, filter_spec=whole_list, is_leaf=is_list
    )
    # Loading with a spec that keeps `like`'s arrays reads only the rest.
    data = _eqx_bytes(tree, filter_spec=skip_arrays)
    like = (jnp.zeros(3, jnp.int32), [0, 0, 0], {"k": jnp.zeros(2)})

    def keep_arrays(f: Any, x: Any) -> Any:
        return x if isinstance(x, jax.Array) else ceqx.default_deserialise_filter_spec(f, x)

    ours = ceqx.tree_deserialise_leaves(io.BytesIO(data), like, filter_spec=keep_arrays)
    theirs = eqx.tree_deserialise_leaves(io.BytesIO(data), like, filter_spec=keep_arrays)
    assert eqx.tree_equal(ours, theirs) and ours[1] == [4, 5, 6]


def test_abstract_like_from_filter_eval_shape() -> None:
    conv = tm.nn.Conv2d(2, 3, 3, key=jax.random.key(0))
    abstract = tm.filter_eval_shape(lambda: tm.nn.Conv2d(2, 3, 3, key=jax.random.key(1)))
    back = ceqx.tree_deserialise_leaves(io.BytesIO(_tm_bytes(conv)), abstract)
    assert tm.tree_equal(back, conv)


# Every layer: Equinox saves, treemod loads (same outputs), and the reverse.


class Case:
    """An Equinox layer, the same architecture in treemod, and how each is called."""

    def __init__(
        self,
        make_eqx: Callable[[Any], Any],
        make_tm: Callable[[int], Any],
        x: Any,
        run_eqx: Callable[[Any, Any], Any] | None = None,
        run_tm: Callable[[Any, Any], Any] | None = None,
        stateful: bool = False,
    ) -> None:
        self.make_eqx, self.make_tm, self.x = make_eqx, make_tm, x
        self.run_eqx = run_eqx or (lambda m, x: m(x))
        self.run_tm = run_tm or (lambda m, x: m(x))
        self.stateful = stateful


def _k(seed: int) -> jax.Array:
    return jax.random.key(seed)


def _x(*shape: int, seed: int = 3) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


T = lambda: tm.nn  # noqa: E731


def _bn_eqx(nn: Any) -> Any:
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode="ema", momentum=0.9)
    bn = _noisy(bn, 5)
    # One training call, so the statistics are real.
    _, state = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        _x(6, 3, 4, seed=8), state
    )
    return bn, state


def _sn_eqx(nn: Any) -> Any:
    sn, state = nn.make_with_state(nn.SpectralNorm)(nn.Linear(3, 4, key=KEY), "weight", key=KEY)
    sn = _noisy(sn, 6)
    _, state = sn(_x(3), state)
    return sn, state


CASES: dict[str, Case] = {
    "Linear": Case(
        lambda nn: nn.Linear(3, 4, key=KEY), lambda s: T().Linear(3, 4, key=_k(s)), _x(3)
    ),
    "Identity": Case(lambda nn: nn.Identity(), lambda s: T().Identity(), _x(3)),
    "MLP": Case(
        lambda nn: nn.MLP(2, 3, 4, 2, key=KEY), lambda s: T().MLP(2, 3, 4, 2, key=_k(s)), _x(2)
    ),
    "Sequential": Case(
        lambda nn: nn.Sequential([nn.Linear(2, 3, key=KEY), nn.Lambda(jax.nn.relu)]),
        lambda s: T().Sequential([T().Linear(2, 3, key=_k(s)), T().Lambda(jax.nn.relu)]),
        _x(2),
    ),
    "Embedding": Case(
        lambda nn: nn.Embedding(5, 3, key=KEY),
        lambda s: T().Embedding(5, 3, key=_k(s)),
        jnp.array(2),
    ),
    "LayerNorm": Case(lambda nn: _noisy(nn.LayerNorm(3), 1), lambda s: T().LayerNorm(3), _x(3)),
    "GroupNorm": Case(
        lambda nn: _noisy(nn.GroupNorm(2, 4), 1), lambda s: T().GroupNorm(2, 4), _x(4, 5)
    ),
    "RMSNorm": Case(lambda nn: _noisy(nn.RMSNorm(3), 1), lambda s: T().RMSNorm(3), _x(3)),
    "Dropout": Case(
        lambda nn: nn.Dropout(0.3, inference=True),
        lambda s: T().Dropout(0.7),
        _x(3),
        run_eqx=lambda m, x: m(x, inference=True),
        run_tm=lambda m, x: m(x, inference=True),
    ),
    "PReLU": Case(lambda nn: nn.PReLU(0.1), lambda s: T().PReLU(0.5), _x(5)),
    "PReLU_vector": Case(
        lambda nn: nn.PReLU(jnp.array([0.1, 0.2, 0.3])), lambda s: T().PReLU(jnp.zeros(3)), _x(3)
    ),
    "GRUCell": Case(
        lambda nn: nn.GRUCell(3, 4, key=KEY),
        lambda s: T().GRUCell(3, 4, key=_k(s)),
        (_x(3), _x(4, seed=4)),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "LSTMCell": Case(
        lambda nn: nn.LSTMCell(3, 4, key=KEY),
        lambda s: T().LSTMCell(3, 4, key=_k(s)),
        (_x(3), (_x(4, seed=4), _x(4, seed=5))),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "MultiheadAttention": Case(
        lambda nn: nn.MultiheadAttention(2, 4, key=KEY),
        lambda s: T().MultiheadAttention(2, 4, key=_k(s)),
        (_x(5, 4), _x(6, 4, seed=4), _x(6, 4, seed=5)),
        run_eqx=lambda m, x: m(*x),
        run_tm=lambda m, x: m(*x),
    ),
    "RotaryPositionalEmbedding": Case(
        lambda nn: nn.RotaryPositionalEmbedding(4),
        lambda s: T().RotaryPositionalEmbedding(4),
        _x(5, 4),
    ),
    "WeightNorm": Case(
        lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=KEY)),
        lambda s: T().WeightNorm(T().Linear(3, 4, key=_k(s))),
        _x(3),
    ),
    "BatchNorm": Case(
        _bn_eqx,
        lambda s: T().BatchNorm(3, momentum=0.1),
        _x(6, 3, 4, seed=9),
        run_eqx=lambda m, x: jax.vmap(
            lambda y: m[0](y, m[1], inference=True)[0], axis_name="batch"
        )(x),
        run_tm=lambda m, x: m(x, inference=True),
        stateful=True,
    ),
    "SpectralNorm": Case(
        _sn_eqx,
        lambda s: T().SpectralNorm(T().Linear(3, 4, key=_k(s)), key=_k(s + 1)),
        _x(3),
        run_eqx=lambda m, x: m[0](x, m[1], inference=True)[0],
        run_tm=lambda m, x: m(x, inference=True),
        stateful=True,
    ),
}
# Convolutions in every dimension (their kernels' layouts are converted per dimension); the
# grouped layouts, whose conversion does not depend on the dimension, in two dimensions.
for _n in (1, 2, 3):
    _sp = (5,) * _n
    CASES[f"Conv{_n}d"] = Case(
        lambda nn, n=_n: getattr(nn, f"Conv{n}d")(2, 4, 3, stride=2, padding=1, key=KEY),
        lambda s, n=_n: getattr(T(), f"Conv{n}d")(2, 4, 3, stride=2, padding=1, key=_k(s)),
        _x(2, *_sp),
    )
    CASES[f"ConvTranspose{_n}d"] = Case(
        lambda nn, n=_n: getattr(nn, f"ConvTranspose{n}d")(
            2, 4, 3, stride=2, padding=1, output_padding=1, key=KEY
        ),
        lambda s, n=_n: getattr(T(), f"ConvTranspose{n}d")(
            2, 4, 3, stride=2, padding=1, output_padding=1, key=_k(s)
        ),
        _x(2, *_sp),
    )
CASES["Conv2d_groups"] = Case(
    lambda nn: nn.Conv2d(4, 6, 2, groups=2, key=KEY),
    lambda s: T().Conv2d(4, 6, 2, groups=2, key=_k(s)),
    _x(4, 5, 5),
)
CASES["ConvTranspose2d_groups"] = Case(
    lambda nn: nn.ConvTranspose2d(4, 6, 3, dilation=2, groups=2, key=KEY),
    lambda s: T().ConvTranspose2d(4, 6, 3, dilation=2, groups=2, key=_k(s)),
    _x(4, 5, 5),
)
# Pools hold no parameters (their files hold the same leaves in every dimension): each kind
# once, the three dimensions spread over them.
for _kind, _n, _adaptive_n in (("Max", 1, 2), ("Avg", 3, 1)):
    CASES[f"{_kind}Pool{_n}d"] = Case(
        lambda nn, n=_n, kind=_kind: getattr(nn, f"{kind}Pool{n}d")(3, stride=2, padding=1),
        lambda s, n=_n, kind=_kind: getattr(T(), f"{kind}Pool{n}d")(3, stride=2, padding=1),
        _x(2, *(5,) * _n),
    )
    CASES[f"Adaptive{_kind}Pool{_adaptive_n}d"] = Case(
        lambda nn, n=_adaptive_n, kind=_kind: getattr(nn, f"Adaptive{kind}Pool{n}d")(2),
        lambda s, n=_adaptive_n, kind=_kind: getattr(T(), f"Adaptive{kind}Pool{n}d")(2),
        _x(2, *(4,) * _adaptive_n),
    )


def _filled(abstract: Any, seed: int) -> Any:
    """`abstract` (from a filter_eval_shape) with every float array drawn from a normal."""
    rng = np.random.default_rng(seed)

    def fill(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        assert jnp.issubdtype(leaf.dtype, jnp.floating), leaf
        return jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)

    return jtu.tree_map(fill, abstract)


def _built(make: Callable[[], Any], seed: int = 0) -> Any:
    """`make()`'s layer, built under filter_eval_shape and `_filled`."""
    return _filled(eqx.filter_eval_shape(make), seed)


# The layers are built by their own classes under filter_eval_shape and filled with random
# values: a layer's random initialiser compiles for each new shape (~2 s for a 3-D kernel on
# the CPU), and the values are arbitrary here anyway. A stateful layer is built as it is, for its
# statistics come from a real call.


def _eqx_model(case: Case, nn: Any, seed: int) -> Any:
    """The case's Equinox (or compat) layer with random values."""
    if case.stateful:
        return case.make_eqx(nn)
    return _built(lambda: case.make_eqx(nn), seed)


def _tm_model(case: Case, seed: int) -> Any:
    """The case's treemod layer with random values."""
    if case.stateful:
        return _noisy(case.make_tm(seed), seed)
    return _built(lambda: case.make_tm(seed), seed)


# Leaf by leaf: the two libraries' outputs may be different containers.
_close = functools.partial(close, rtol=2e-5, atol=2e-5, check_structure=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_equinox_file_loads_into_treemod_layer(name: str) -> None:
    case = CASES[name]
    model = _eqx_model(case, eqx.nn, 2)
    data = _eqx_bytes(model)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), _tm_model(case, 10))
    _close(case.run_tm(loaded, case.x), case.run_eqx(model, case.x))
    # And treemod writes back exactly the bytes it read.
    assert _tm_bytes(loaded) == data


@pytest.mark.parametrize("name", sorted(CASES))
def test_equinox_file_loads_into_compat_layer(name: str) -> None:
    case = CASES[name]
    model = _eqx_model(case, eqx.nn, 2)
    data = _eqx_bytes(model)
    like = _eqx_model(case, ceqx.nn, 20)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), like)
    _close(case.run_eqx(loaded, case.x), case.run_eqx(model, case.x))
    assert _tm_bytes(loaded) == data
    # Equinox reads the compat layer's own file into its layer.
    back = eqx.tree_deserialise_leaves(io.BytesIO(_tm_bytes(loaded)), _eqx_model(case, eqx.nn, 21))
    _close(case.run_eqx(back, case.x), case.run_eqx(model, case.x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_treemod_file_loads_into_equinox_layer(name: str) -> None:
    case = CASES[name]
    layer = _tm_model(case, 11)
    data = _tm_bytes(layer)
    loaded = eqx.tree_deserialise_leaves(io.BytesIO(data), _eqx_model(case, eqx.nn, 30))
    _close(case.run_eqx(loaded, case.x), case.run_tm(layer, case.x))
    assert _eqx_bytes(loaded) == data


def test_channels_last_conv_converts_its_kernel() -> None:
    conv = _built(lambda: eqx.nn.Conv2d(2, 4, (2, 3), key=KEY))
    x = _x(2, 5, 6)
    like = _built(lambda: tm.nn.Conv(2, 2, 4, (2, 3), channels_last=True, key=_k(1)), 1)
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes(conv)), like)
    _close(loaded(jnp.moveaxis(x, 0, -1)), jnp.moveaxis(conv(x), 0, -1))
    assert _tm_bytes(loaded) == _eqx_bytes(conv)
    up = _built(
        lambda: tm.nn.ConvTranspose(2, 2, 4, (2, 3), stride=2, channels_last=True, key=_k(2)), 2
    )
    ref = eqx.tree_deserialise_leaves(
        io.BytesIO(_tm_bytes(up)),
        _built(lambda: eqx.nn.ConvTranspose2d(2, 4, (2, 3), stride=2, key=KEY), 3),
    )
    _close(up(jnp.moveaxis(x, 0, -1)), jnp.moveaxis(ref(x), 0, -1))


def test_batch_norm_before_any_training_call_loads_treemods_initial_statistics() -> None:
    bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="ema")
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes((bn, state))), tm.nn.BatchNorm(3))
    assert tm.tree_equal(loaded, tm.nn.BatchNorm(3))


# Errors name the key path and say what to do.


def test_shape_mismatch_names_the_key_path() -> None:
    data = _eqx_bytes(_built(lambda: eqx.nn.MLP(2, 3, 4, 1, key=KEY)))
    with pytest.raises(
        tm.CheckpointError,
        match=r"has changed shape from \(5, 2\) in `like` to \(4, 2\) on disk: .* leaf 1 of 4 at "
        r"\.layers\[0\]\.weight",
    ):
        ceqx.tree_deserialise_leaves(
            io.BytesIO(data), _built(lambda: tm.nn.MLP(2, 3, 5, 1, key=_k(0)))
        )


def test_converted_layer_mismatch_names_equinox_layout() -> None:
    data = _eqx_bytes(_built(lambda: eqx.nn.Conv2d(2, 3, 3, key=KEY)))
    with pytest.raises(tm.CheckpointError, match=r"at \.weight \(in Equinox's layout of Conv2d\)"):
        ceqx.tree_deserialise_leaves(
            io.BytesIO(data), _built(lambda: tm.nn.Conv2d(2, 4, 3, key=_k(0)))
        )


def test_dtype_mismatch_is_a_runtime_error_too() -> None:
    data = _eqx_bytes([jnp.ones(2, jnp.float16)])
    with pytest.raises(
        RuntimeError, match=r"changed dtype from float32 in `like` to float16 on disk: .* at \[0\]"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), [jnp.zeros(2)])


def test_messages_carry_equinoxs_wording() -> None:
    # Equinox's messages name the key path as a tuple of keys; code matching them keeps working.
    data = _eqx_bytes((jnp.array(1), {}))
    like = (jnp.array(2), {"a": jnp.array(2), "b": jnp.array(2)})
    with pytest.raises(
        RuntimeError, match=r"Error at leaf with path \(SequenceKey\(idx=1\), DictKey\(key='a'\)\)"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), like)
    data = _eqx_bytes((jnp.array(1), {"a": jnp.array(1)}))
    like = (jnp.array(2), {"a": jnp.array(2.0)})
    with pytest.raises(
        RuntimeError,
        match=r"Deserialised leaf at path \(SequenceKey\(idx=1\), DictKey\(key='a'\)\)",
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), like)


def test_type_mismatch() -> None:
    data = _eqx_bytes({"a": np.ones(2)})
    with pytest.raises(tm.CheckpointError, match=r"\['a'\] could not be read: ValueError"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), {"a": 0})
    with pytest.raises(
        tm.CheckpointError, match=r"changed type from int in `like` to str on disk: .* at \['a'\]"
    ):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), {"a": 0}, filter_spec=lambda f, x: "?")


def test_too_few_leaves(tmp_path: pathlib.Path) -> None:
    eqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2)])
    with pytest.raises(tm.CheckpointError, match=r"ends before leaf 2 of 2 \(\[1\]\)"):
        ceqx.tree_deserialise_leaves(tmp_path / "m", [jnp.ones(2), jnp.ones(3)])


def test_too_many_leaves(tmp_path: pathlib.Path) -> None:
    eqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2), 5])
    with pytest.raises(tm.CheckpointError, match=r"m\.eqx holds more data after the 1 leaves"):
        ceqx.tree_deserialise_leaves(tmp_path / "m", [jnp.ones(2)])


def test_stateful_model_saved_without_its_state_says_so() -> None:
    bn, _ = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="ema")
    with pytest.raises(tm.CheckpointError, match=r"without its state"):
        ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes(bn)), tm.nn.BatchNorm(3))


def test_safetensors_file_points_to_load(tmp_path: pathlib.Path) -> None:
    tm.save(tmp_path / "c.safetensors", {"w": jnp.ones(2)})
    with pytest.raises(tm.CheckpointError, match=r"safetensors file .* tm\.load\(path, like\)"):
        ceqx.tree_deserialise_leaves(tmp_path / "c.safetensors", {"w": jnp.ones(2)})


def test_garbage_file_is_refused() -> None:
    with pytest.raises(tm.CheckpointError, match=r"not in Equinox's format"):
        ceqx.tree_deserialise_leaves(io.BytesIO(b"hello world, not npy"), [jnp.ones(2)])


def test_corrupt_record_names_the_leaf() -> None:
    data = bytearray(_eqx_bytes([jnp.ones(2), jnp.ones(3)]))
    cut = bytes(data[: len(data) - 4])
    with pytest.raises(tm.CheckpointError, match=r"leaf 2 of 2 at \[1\] could not be read"):
        ceqx.tree_deserialise_leaves(io.BytesIO(cut), [jnp.ones(2), jnp.ones(3)])


def test_load_points_equinox_files_to_tree_deserialise_leaves(tmp_path: pathlib.Path) -> None:
    ceqx.tree_serialise_leaves(tmp_path / "m", {"w": jnp.ones(2)})
    hint = r"NumPy \.npy records.*treemod\.compat\.equinox\.tree_deserialise_leaves\(path, like\)"
    with pytest.raises(tm.CheckpointError, match=hint):
        tm.load(tmp_path / "m.eqx", like={"w": jnp.ones(2)})
    buf = io.BytesIO(b"prefix" + _eqx_bytes({"w": jnp.ones(2)}))
    buf.seek(6)
    with pytest.raises(tm.CheckpointError, match=hint):
        tm.load(buf, like={"w": jnp.ones(2)})


def test_tracer_refused_when_saving() -> None:
    def f(x: jax.Array) -> jax.Array:
        ceqx.tree_serialise_leaves(io.BytesIO(), {"x": x})
        return x

    with pytest.raises(TypeError, match=r"\['x'\] is a tracer"):
        jax.jit(f)(jnp.ones(2))


def test_batch_mode_batch_norm_loads_into_the_compat_layer() -> None:
    # Equinox's mode="batch" keeps a debiasing counter: the compat BatchNorm holds it.
    def make(nn: Any) -> Any:
        return nn.make_with_state(nn.BatchNorm)(3, "batch", mode="batch", momentum=0.9)

    bn, state = make(eqx.nn)
    bn = _noisy(bn, 7)
    call = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    for seed in (1, 2):
        _, state = call(_x(6, 3, 4, seed=seed), state)
    data = _eqx_bytes((bn, state))
    loaded = ceqx.tree_deserialise_leaves(io.BytesIO(data), make(ceqx.nn))
    assert _tm_bytes(loaded) == data
    x = _x(6, 3, 4, seed=9)
    run = CASES["BatchNorm"].run_eqx
    _close(run(loaded, x), run((bn, state), x))
    # treemod's BatchNorm holds ema-mode statistics; a batch-mode file says which layer reads it.
    with pytest.raises(tm.CheckpointError, match=r"changed dtype from bool in `like` to int32"):
        ceqx.tree_deserialise_leaves(io.BytesIO(data), tm.nn.BatchNorm(3))


def test_failed_write_names_the_leaf_and_keeps_the_old_file(tmp_path: pathlib.Path) -> None:
    ceqx.tree_serialise_leaves(tmp_path / "m", [jnp.ones(2)])
    before = (tmp_path / "m.eqx").read_bytes()

    def refuse_ints(f: Any, x: Any) -> None:
        if isinstance(x, int):
            raise ValueError("no ints here")
        ceqx.default_serialise_filter_spec(f, x)

    with pytest.raises(RuntimeError, match=r"leaf at \[1\]\['n'\]: ValueError: no ints here"):
        ceqx.tree_serialise_leaves(
            tmp_path / "m", [jnp.zeros(2), {"n": 3}], filter_spec=refuse_ints
        )
    assert (tmp_path / "m.eqx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.eqx"]


def test_shared_weights_load_both_ways() -> None:
    # Equinox's Shared (tied embedding and output layer) and treemod's hold the same leaves.
    def tied(nn: Any, keys: tuple[Any, Any]) -> Any:
        emb, lin = nn.Embedding(5, 3, key=keys[0]), nn.Linear(3, 5, key=keys[1])
        return nn.Shared((emb, lin), lambda p: p[1].weight, lambda p: p[0].weight)

    theirs = _noisy(tied(eqx.nn, tuple(jax.random.split(KEY))), 3)
    ours = ceqx.tree_deserialise_leaves(io.BytesIO(_eqx_bytes(theirs)), tied(tm.nn, (_k(0), _k(1))))
    x = jnp.array(4)
    (e_emb, e_lin), (t_emb, t_lin) = theirs(), ours()
    _close(t_lin(t_emb(x)), e_lin(e_emb(x)))
    assert _tm_bytes(ours) == _eqx_bytes(theirs)
