"""The compat namespace's layers against real Equinox: same key, same parameters, same outputs.

Each case builds the layer with Equinox and with `treemod.compat.equinox` from the same
arguments and key, then compares every array leaf exactly (Equinox's initialisation), the
fields users read, and the outputs on the same inputs; gradients through `filter_jit` and
`filter_grad` are compared too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import treemod as tm
import treemod.compat.equinox as teqx

from helpers import normal

eqx = pytest.importorskip("equinox")

K = jax.random.key(0)
X = jax.random.key(1)


def _arrays(tree: Any) -> list[Any]:
    return [x for x in jtu.tree_leaves(tree) if isinstance(x, jax.Array)]


def _quiet(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Build with deprecation warnings silenced (both libraries warn about deprecated names)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(*args, **kwargs)


def _x3(m: Any) -> Any:
    return m(normal((3,)))


# name -> (build(nn), call(layer) -> output)
CASES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "Linear": (lambda nn: nn.Linear(3, 4, key=K), _x3),
    "Linear-nobias": (
        lambda nn: nn.Linear(3, 4, use_bias=False, key=K),
        _x3,
    ),
    "Linear-scalar-in": (lambda nn: nn.Linear("scalar", 4, key=K), lambda m: m(jnp.array(0.5))),
    "Linear-scalar-out": (lambda nn: nn.Linear(3, "scalar", key=K), _x3),
    "MLP": (
        lambda nn: nn.MLP(3, 2, 8, 3, activation=jax.nn.tanh, key=K),
        _x3,
    ),
    "MLP-final": (
        lambda nn: nn.MLP(
            3, 2, 8, 2, final_activation=jax.nn.sigmoid, use_bias=False, use_final_bias=False, key=K
        ),
        _x3,
    ),
    "MLP-depth0": (lambda nn: nn.MLP(3, 2, 8, 0, key=K), _x3),
    "MLP-scan": (lambda nn: nn.MLP(3, 2, 8, 4, scan=True, key=K), _x3),
    "MLP-scan-depth1": (
        lambda nn: nn.MLP(3, 2, 8, 1, scan=True, key=K),
        _x3,
    ),
    "MLP-scan-depth0": (
        lambda nn: nn.MLP(3, 2, 8, 0, scan=True, key=K),
        _x3,
    ),
    "MLP-scalar": (lambda nn: nn.MLP("scalar", "scalar", 8, 2, key=K), lambda m: m(jnp.array(0.3))),
    "Embedding": (lambda nn: nn.Embedding(10, 4, key=K), lambda m: m(jnp.array(7))),
    "Embedding-weight": (
        lambda nn: nn.Embedding(weight=jnp.arange(12.0).reshape(4, 3)),
        lambda m: m(jnp.array(2)),
    ),
    "LayerNorm": (lambda nn: nn.LayerNorm(5), lambda m: m(normal((5,)))),
    "LayerNorm-shape": (lambda nn: nn.LayerNorm((2, 3), eps=1e-3), lambda m: m(normal((2, 3)))),
    "LayerNorm-noweight": (
        lambda nn: nn.LayerNorm(5, use_weight=False),
        lambda m: m(normal((5,))),
    ),
    "LayerNorm-noaffine": (
        lambda nn: _quiet(nn.LayerNorm, 5, elementwise_affine=False),
        lambda m: m(normal((5,))),
    ),
    "GroupNorm": (lambda nn: nn.GroupNorm(2, 4), lambda m: m(normal((4, 6)))),
    "GroupNorm-noaffine": (
        lambda nn: nn.GroupNorm(2, 4, channelwise_affine=False),
        lambda m: m(normal((4, 3, 3))),
    ),
    "RMSNorm": (lambda nn: nn.RMSNorm(5), lambda m: m(normal((5,)))),
    "RMSNorm-nobias": (lambda nn: nn.RMSNorm(5, use_bias=False), lambda m: m(normal((5,)))),
    "Dropout": (lambda nn: nn.Dropout(0.3), lambda m: m(normal((4, 5)), key=X)),
    "Dropout-inference": (lambda nn: nn.Dropout(0.3, inference=True), lambda m: m(normal((4,)))),
    "Sequential": (
        lambda nn: nn.Sequential(
            [nn.Linear(3, 4, key=K), nn.Lambda(jax.nn.relu), nn.Dropout(0.5), nn.Identity()]
        ),
        lambda m: m(normal((3,)), key=X),
    ),
    "Sequential-slice": (
        lambda nn: nn.Sequential([nn.Linear(3, 4, key=K), nn.Lambda(jnp.tanh)])[1:],
        _x3,
    ),
    "GRUCell": (lambda nn: nn.GRUCell(3, 4, key=K), lambda m: m(normal((3,)), normal((4,), 0))),
    "GRUCell-nobias": (
        lambda nn: nn.GRUCell(3, 4, use_bias=False, key=K),
        lambda m: m(normal((3,)), normal((4,), 0)),
    ),
    "LSTMCell": (
        lambda nn: nn.LSTMCell(3, 4, key=K),
        lambda m: m(normal((3,)), (normal((4,), 0), normal((4,), 1))),
    ),
    "MultiheadAttention": (
        lambda nn: nn.MultiheadAttention(
            2, 8, key_size=6, value_size=5, output_size=7, qk_size=3, vo_size=4, key=K
        ),
        lambda m: m(normal((5, 8)), normal((6, 6), 0), normal((6, 5), 0)),
    ),
    "MultiheadAttention-bias": (
        lambda nn: nn.MultiheadAttention(
            4,
            8,
            use_query_bias=True,
            use_key_bias=True,
            use_value_bias=True,
            use_output_bias=True,
            key=K,
        ),
        lambda m: m(normal((5, 8)), normal((5, 8)), normal((5, 8))),
    ),
    "RotaryPositionalEmbedding": (
        lambda nn: nn.RotaryPositionalEmbedding(6, theta=500.0),
        lambda m: m(normal((4, 6))),
    ),
    "WeightNorm": (lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=K)), _x3),
    "WeightNorm-axisNone": (
        lambda nn: nn.WeightNorm(nn.Linear(3, 4, key=K), axis=None),
        _x3,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_equinox(name: str) -> None:
    build, call = CASES[name]
    ours, theirs = build(teqx.nn), build(eqx.nn)
    mine, ref = _arrays(ours), _arrays(theirs)
    assert len(mine) == len(ref)
    for a, b in zip(mine, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)  # Equinox's initialisation, exactly
    got, expected = call(ours), call(theirs)
    for a, b in zip(jtu.tree_leaves(got), jtu.tree_leaves(expected), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fields_users_read_have_equinox_names() -> None:
    for name in ["Linear", "MLP", "LayerNorm", "GroupNorm", "GRUCell", "MultiheadAttention"]:
        ours, theirs = CASES[name][0](teqx.nn), CASES[name][0](eqx.nn)
        public = [f for f in vars(theirs) if not f.startswith("_")]
        for field in public:
            assert hasattr(ours, field), (name, field)
    mlp = teqx.nn.MLP(3, 2, 8, 3, scan=True, key=K)
    assert (mlp.use_bias, mlp.use_final_bias, mlp.scan) == (True, True, True)
    assert len(mlp.layers) == 3 and mlp.layers[1].weight.shape == (2, 8, 8)


def test_shared_matches_equinox() -> None:
    def build(nn: Any) -> Any:
        embedding = nn.Embedding(6, 4, key=K)
        head = nn.Linear(4, 6, use_bias=False, key=X)
        return nn.Shared((embedding, head), lambda p: p[1].weight, lambda p: p[0].weight)

    ours, theirs = build(teqx.nn), build(eqx.nn)
    (e1, h1), (e2, h2) = ours(), theirs()
    np.testing.assert_array_equal(h1.weight, h2.weight)
    np.testing.assert_array_equal(h1(e1(jnp.array(3))), h2(e2(jnp.array(3))))


def test_gradients_through_filter_jit_match_equinox() -> None:
    def build(nn: Any) -> Any:
        return nn.Sequential(
            [
                nn.Linear(3, 8, key=K),
                nn.LayerNorm(8),
                nn.Lambda(jax.nn.gelu),
                nn.MLP(8, 2, 8, 2, scan=True, key=X),
            ]
        )

    x = normal((5, 3))

    def loss(model: Any) -> Any:
        return jnp.sum(jax.vmap(model)(x) ** 2)

    g1 = teqx.filter_jit(teqx.filter_grad(loss))(build(teqx.nn))
    g2 = eqx.filter_jit(eqx.filter_grad(loss))(build(eqx.nn))
    for a, b in zip(_arrays(g1), _arrays(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_norm_layers_pass_a_state_through() -> None:
    state = teqx.nn.make_with_state(teqx.nn.BatchNorm)(2, "b", mode="batch")[1]
    x = normal((2, 3))
    for layer in (teqx.nn.LayerNorm((2, 3)), teqx.nn.GroupNorm(1, 2), teqx.nn.RMSNorm((2, 3))):
        y, same = layer(x, state)
        assert same is state
        np.testing.assert_array_equal(y, layer(x))


def test_mlp_scan_errors() -> None:
    with pytest.raises(ValueError, match=r"scan=True.*width_size must be one int; got \(8, 4\)"):
        teqx.nn.MLP(3, 2, (8, 4), 2, scan=True, key=K)


def test_equinox_conventions_treemod_refuses() -> None:
    # Zero sizes, negative embedding indices, the deprecated `deterministic`: Equinox's.
    for sizes in [(0, 4), (4, 0)]:
        ours, theirs = teqx.nn.Linear(*sizes, key=K), eqx.nn.Linear(*sizes, key=K)
        np.testing.assert_array_equal(ours.weight, theirs.weight)
        x = normal((sizes[0],))
        np.testing.assert_array_equal(ours(x), theirs(x))
    weight = jnp.linspace(0.1, 10, 100).reshape(10, 10)
    for index in [-1, -10, 3]:
        np.testing.assert_array_equal(
            teqx.nn.Embedding(weight=weight)(jnp.array(index)),
            eqx.nn.Embedding(weight=weight)(jnp.array(index)),
        )
    with pytest.raises(IndexError, match="index -1 at position"):
        teqx.nn.Embedding(weight=weight)(jnp.array(-11))
    with pytest.warns(DeprecationWarning, match="deterministic"):
        dropout = teqx.nn.Dropout(0.5, deterministic=True)
    assert dropout.inference and dropout.deterministic


def test_rope_frequencies_and_single_head_attention_match_equinox() -> None:
    for dtype in [jnp.float32, jnp.float16]:
        ours = teqx.nn.RotaryPositionalEmbedding.precompute_freqs_cis(8, 16, 500.0, dtype)
        theirs = eqx.nn.RotaryPositionalEmbedding.precompute_freqs_cis(8, 16, 500.0, dtype)
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    from equinox.nn import _attention as theirs_attention

    from treemod.compat.equinox.nn import _attention as ours_attention

    q, k, v = normal((3, 4)), normal((5, 4), 0), normal((5, 2), 0)
    mask = jnp.tril(jnp.ones((3, 5), bool))
    np.testing.assert_allclose(
        ours_attention.dot_product_attention_weights(q, k, mask),
        theirs_attention.dot_product_attention_weights(q, k, mask),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        ours_attention.dot_product_attention(q, k, v, mask),
        theirs_attention.dot_product_attention(q, k, v, mask),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match=r"mask must have shape \(q_seq, kv_seq\)=\(3, 5\)"):
        ours_attention.dot_product_attention_weights(q, k, mask[:, :2])


def test_batch_norm_accepts_a_batch_of_one_like_equinox() -> None:
    ours, s1 = teqx.nn.make_with_state(teqx.nn.BatchNorm)(2, "b", mode="batch")
    theirs, s2 = eqx.nn.make_with_state(eqx.nn.BatchNorm)(2, "b", mode="batch")
    x = normal((1, 2, 3))
    run = {"in_axes": (0, None), "out_axes": (0, None), "axis_name": "b"}
    y1, _ = jax.vmap(ours, **run)(x, s1)
    y2, _ = jax.vmap(theirs, **run)(x, s2)
    np.testing.assert_allclose(y1, y2, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_mlp_learnt_activation_per_neuron_like_equinox(scan: bool) -> None:
    def build(lib: Any) -> Any:
        return lib.nn.MLP(
            2, 5, 8, 2, lib.nn.PReLU(), final_activation=lib.nn.PReLU(), scan=scan, key=K
        )

    ours, theirs = build(teqx), build(eqx)
    assert ours.activation.negative_slope.shape == (2, 8)
    assert ours.final_activation.negative_slope.shape == (5,)
    x = jnp.array([0.5, -0.7])
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-6)

    def loss(model: Any) -> Any:
        return jnp.sum(model(x))

    g1 = teqx.filter_jit(teqx.filter_grad(loss))(ours)
    g2 = eqx.filter_jit(eqx.filter_grad(loss))(theirs)
    np.testing.assert_allclose(
        g1.activation.negative_slope, g2.activation.negative_slope, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        g1.final_activation.negative_slope, g2.final_activation.negative_slope, rtol=1e-5
    )


def test_isinstance_across_namespaces() -> None:
    import treemod as tm

    mha = teqx.nn.MultiheadAttention(2, 4, key=K)
    # Equinox code's custom initialisers select layers by type; treemod-built ones count.
    assert isinstance(mha.query_proj, teqx.nn.Linear)
    assert isinstance(tm.nn.Linear(2, 3, key=K), teqx.nn.Linear)
    assert isinstance(teqx.nn.Linear(2, 3, key=K), tm.nn.Linear)
    assert isinstance(tm.nn.LayerNorm(3), teqx.nn.LayerNorm)
    assert not isinstance(tm.nn.Conv1d(1, 1, 1, key=K), teqx.nn.Linear)

    class Custom(teqx.nn.Linear):
        pass

    assert not isinstance(tm.nn.Linear(2, 3, key=K), Custom)


def test_user_layers_and_those_inside_attention_are_one_node_type() -> None:
    # In Equinox a Linear the user builds and the projections inside MultiheadAttention have
    # one pytree type, so they compare equal, swap with tree_at and share with nn.Shared.
    for nn, tree_equal in ((eqx.nn, eqx.tree_equal), (teqx.nn, teqx.tree_equal)):
        mine = nn.Linear(12, 12, use_bias=False, key=K)
        attention = nn.MultiheadAttention(3, 12, key=X)
        assert jtu.tree_structure(mine) == jtu.tree_structure(attention.key_proj), nn
        shapes = (teqx.filter_eval_shape(lambda m: m, x) for x in (mine, attention.key_proj))
        assert tree_equal(*shapes) is True, nn
        assert isinstance(mine, nn.Linear) and isinstance(attention.key_proj, nn.Linear)
        dropout = nn.Dropout(0.0)
        assert jtu.tree_structure(dropout) == jtu.tree_structure(attention.dropout), nn
        assert dropout.deterministic is False and isinstance(attention.dropout, nn.Dropout)

        class Doubled(nn.Linear):  # a user's subclass keeps its own class, as in Equinox
            def __call__(self, x: Any) -> Any:
                return 2 * super().__call__(x)

        doubled = Doubled(2, 2, key=K)
        assert type(doubled) is Doubled and isinstance(doubled, nn.Linear)
        np.testing.assert_allclose(doubled(jnp.ones(2)), 2 * nn.Linear(2, 2, key=K)(jnp.ones(2)))


def test_shared_node_inside_attention_matches_equinox() -> None:
    # A user's Linear tied to an attention layer's key projection: the outputs and the
    # gradient reaching the one stored copy are Equinox's.
    def build(nn: Any) -> Any:
        proj = nn.Linear(12, 12, use_bias=False, key=K)
        attention = nn.MultiheadAttention(3, 12, key=X)
        get, where = (
            (lambda p: (p[0], p[0].weight + 1)),
            (lambda p: (p[1].key_proj, p[1].query_proj.weight)),
        )
        return nn.Shared((proj, attention), where, get)

    x = normal((5, 12))

    def loss(shared: Any) -> Any:
        proj, attention = shared()
        return jnp.sum(jax.vmap(proj)(attention(x, x, x)) ** 2)

    g1 = teqx.filter_jit(teqx.filter_grad(loss))(build(teqx.nn))
    g2 = eqx.filter_jit(eqx.filter_grad(loss))(build(eqx.nn))
    ours, theirs = _arrays(g1), _arrays(g2)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_shared_mismatch_uses_equinox_words() -> None:
    a, b = jnp.zeros((3, 4)), jnp.zeros((4, 3))
    for nn in (eqx.nn, teqx.nn):
        with pytest.raises(ValueError, match="Every node being shared together"):
            nn.Shared((a, b), lambda p: p[0], lambda p: p[1])


def test_tree_at_edits_stacked_layers_as_in_equinox() -> None:
    # Equinox code edits layers whose arrays carry a leading axis: an ensemble built by
    # filter_vmap, MLP(scan=True)'s hidden stack. Equinox's tree_at does not check them.
    def edit(nn: Any, tree_at: Any, filter_vmap: Any) -> Any:
        ensemble = filter_vmap(lambda k: nn.MLP(2, 3, 8, 2, key=k))(jax.random.split(K, 4))
        ensemble = tree_at(lambda m: m.layers[0].weight, ensemble, ensemble.layers[0].weight / 2)
        linears = filter_vmap(lambda k: nn.Linear(2, 3, key=k))(jax.random.split(X, 4))
        linears = tree_at(lambda m: m.bias, linears, linears.bias + 1)
        scanned = nn.MLP(2, 3, 8, 4, scan=True, key=X)
        scanned = tree_at(lambda m: m.layers[1].weight, scanned, scanned.layers[1].weight * 2)
        x = normal((2,))
        return (
            filter_vmap(lambda m: m(x))(ensemble),
            filter_vmap(lambda m: m(x))(linears),
            scanned(x),
        )

    ours = edit(teqx.nn, teqx.tree_at, teqx.filter_vmap)
    theirs = edit(eqx.nn, eqx.tree_at, eqx.filter_vmap)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # treemod's own tree_at does not check below a compat MLP either (its stacked layer).
    scanned = teqx.nn.MLP(2, 3, 8, 4, scan=True, key=X)
    edited = tm.tree_at(lambda m: m.layers[1].weight, scanned, scanned.layers[1].weight * 2)
    np.testing.assert_array_equal(edited.layers[1].weight, scanned.layers[1].weight * 2)
