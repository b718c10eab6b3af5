"""Plain JAX on dicts of arrays: the floor every framework is compared with.

Parameters are nested dicts/lists, layers are functions, the step is `jax.jit` of
`jax.value_and_grad` plus an optax update. Layout NHWC for the CNN.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from .case import Case
from .common import count_params, cross_entropy, optimiser, wait
from .spec import BN_EPS, BN_MOMENTUM, LN_EPS, Workload, block_strides

Params = Any


def _linear(key: jax.Array, din: int, dout: int) -> dict[str, jax.Array]:
    kw, kb = jax.random.split(key)
    bound = 1 / math.sqrt(din)
    return {
        "w": jax.random.uniform(kw, (din, dout), minval=-bound, maxval=bound),
        "b": jax.random.uniform(kb, (dout,), minval=-bound, maxval=bound),
    }


def _dense(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


# --- MLP -------------------------------------------------------------------------------------


def _init_mlp(key: jax.Array, w: Workload) -> tuple[Params, Params]:
    sizes = [w.width] * (w.depth + 1) + [w.classes]
    keys = jax.random.split(key, len(sizes) - 1)
    layers = [_linear(k, a, b) for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=True)]
    return {"layers": layers}, {}


def _mlp(params: Params, state: Params, x: jax.Array, key: jax.Array, w: Workload):
    *hidden, last = params["layers"]
    for p in hidden:
        x = jax.nn.relu(_dense(p, x))
    return _dense(last, x), state


# --- ResNet ----------------------------------------------------------------------------------


def _conv_init(key: jax.Array, k: int, cin: int, cout: int) -> jax.Array:
    std = math.sqrt(2.0 / (k * k * cout))  # He (fan-out), as torchvision's ResNet
    return std * jax.random.normal(key, (k, k, cin, cout))


def _conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    pad = (kernel.shape[0] - 1) // 2
    return jax.lax.conv_general_dilated(
        x, kernel, (stride, stride), ((pad, pad), (pad, pad)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )  # fmt: skip


def _bn_init(c: int) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    return (
        {"scale": jnp.ones(c), "bias": jnp.zeros(c)},
        {"mean": jnp.zeros(c), "var": jnp.ones(c)},
    )


def _bn(p: Params, s: Params, x: jax.Array) -> tuple[jax.Array, Params]:
    mean = x.mean(axis=(0, 1, 2))
    var = x.var(axis=(0, 1, 2))
    n = x.size // x.shape[-1]
    y = (x - mean) * jax.lax.rsqrt(var + BN_EPS) * p["scale"] + p["bias"]
    new = {
        "mean": (1 - BN_MOMENTUM) * s["mean"] + BN_MOMENTUM * mean,
        "var": (1 - BN_MOMENTUM) * s["var"] + BN_MOMENTUM * var * (n / (n - 1)),
    }
    return y, new


def _init_resnet(key: jax.Array, w: Workload) -> tuple[Params, Params]:
    specs = block_strides(w)
    keys = iter(jax.random.split(key, 3 * len(specs) + 2))
    params: dict[str, Any] = {"stem": _conv_init(next(keys), 3, 3, w.widths[0])}
    state: dict[str, Any] = {}
    params["stem_bn"], state["stem_bn"] = _bn_init(w.widths[0])
    pblocks, sblocks = [], []
    for cin, cout, stride in specs:
        p: dict[str, Any] = {
            "conv1": _conv_init(next(keys), 3, cin, cout),
            "conv2": _conv_init(next(keys), 3, cout, cout),
        }
        s: dict[str, Any] = {}
        p["bn1"], s["bn1"] = _bn_init(cout)
        p["bn2"], s["bn2"] = _bn_init(cout)
        k = next(keys)
        if stride != 1 or cin != cout:
            p["proj"] = _conv_init(k, 1, cin, cout)
            p["proj_bn"], s["proj_bn"] = _bn_init(cout)
        pblocks.append(p)
        sblocks.append(s)
    params["blocks"], state["blocks"] = pblocks, sblocks
    params["head"] = _linear(next(keys), w.widths[-1], w.classes)
    return params, state


def _resnet(params: Params, state: Params, x: jax.Array, key: jax.Array, w: Workload):
    new: dict[str, Any] = {"blocks": []}
    x, new["stem_bn"] = _bn(params["stem_bn"], state["stem_bn"], _conv(x, params["stem"], 1))
    x = jax.nn.relu(x)
    for (_, _, stride), p, s in zip(
        block_strides(w), params["blocks"], state["blocks"], strict=True
    ):
        ns: dict[str, Any] = {}
        h, ns["bn1"] = _bn(p["bn1"], s["bn1"], _conv(x, p["conv1"], stride))
        h, ns["bn2"] = _bn(p["bn2"], s["bn2"], _conv(jax.nn.relu(h), p["conv2"], 1))
        if "proj" in p:
            x, ns["proj_bn"] = _bn(p["proj_bn"], s["proj_bn"], _conv(x, p["proj"], stride))
        x = jax.nn.relu(h + x)
        new["blocks"].append(ns)
    return _dense(params["head"], x.mean(axis=(1, 2))), new


# --- Transformer -----------------------------------------------------------------------------


def _ln_init(d: int) -> dict[str, jax.Array]:
    return {"scale": jnp.ones(d), "bias": jnp.zeros(d)}


def _ln(p: Params, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * p["scale"] + p["bias"]


def _init_block(key: jax.Array, w: Workload) -> Params:
    k = jax.random.split(key, 6)
    d, h = w.width, w.mlp_ratio * w.width
    return {
        "ln1": _ln_init(d),
        "q": _linear(k[0], d, d),
        "k": _linear(k[1], d, d),
        "v": _linear(k[2], d, d),
        "o": _linear(k[3], d, d),
        "ln2": _ln_init(d),
        "fc1": _linear(k[4], d, h),
        "fc2": _linear(k[5], h, d),
    }


def _dropout(key: jax.Array, rate: float, x: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(key, 1 - rate, x.shape)
    return jnp.where(keep, x / (1 - rate), 0)


def _block(p: Params, x: jax.Array, key: jax.Array, w: Workload) -> jax.Array:
    b, s, d = x.shape
    heads = w.heads
    k1, k2 = jax.random.split(key)
    h = _ln(p["ln1"], x)
    q, k, v = (_dense(p[n], h).reshape(b, s, heads, d // heads) for n in "qkv")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // heads)
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v).reshape(b, s, d)
    x = x + _dropout(k1, w.dropout, _dense(p["o"], att))
    h = _dense(p["fc2"], jax.nn.gelu(_dense(p["fc1"], _ln(p["ln2"], x))))
    return x + _dropout(k2, w.dropout, h)


def _init_transformer(key: jax.Array, w: Workload) -> tuple[Params, Params]:
    ke, kp, kb, kh = jax.random.split(key, 4)
    block_keys = jax.random.split(kb, w.depth)
    if w.scan:
        blocks: Any = jax.vmap(lambda k: _init_block(k, w))(block_keys)
    else:
        blocks = [_init_block(k, w) for k in block_keys]
    params = {
        "embed": jax.random.normal(ke, (w.vocab, w.width)),
        "pos": 0.02 * jax.random.normal(kp, (w.seq, w.width)),
        "blocks": blocks,
        "ln": _ln_init(w.width),
        "head": _linear(kh, w.width, w.classes),
    }
    return params, {}


def _transformer(params: Params, state: Params, tokens: jax.Array, key: jax.Array, w: Workload):
    x = params["embed"][tokens] + params["pos"]
    keys = jax.random.split(key, w.depth)
    if w.scan:
        x, _ = jax.lax.scan(
            lambda x, pk: (_block(pk[0], x, pk[1], w), None), x, (params["blocks"], keys)
        )
    else:
        for p, k in zip(params["blocks"], keys, strict=True):
            x = _block(p, x, k, w)
    return _dense(params["head"], _ln(params["ln"], x).mean(axis=1)), state


# --- the case --------------------------------------------------------------------------------

_MODELS = {
    "mlp": (_init_mlp, _mlp),
    "resnet": (_init_resnet, _resnet),
    "transformer": (_init_transformer, _transformer),
}


def build(w: Workload) -> Case:
    """The plain-JAX version of workload `w`."""
    init_fn, apply_fn = _MODELS[w.kind]
    opt = optimiser()

    def init(key: jax.Array) -> tuple[Params, Params]:
        return init_fn(key, w)

    def loss_fn(params, state, x, y, key):
        logits, new_state = apply_fn(params, state, x, key, w)
        return cross_entropy(logits, y), new_state

    @jax.jit
    def train_step(params, state, opt_state, key, x, y):
        key, sub = jax.random.split(key) if w.random else (key, None)
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y, sub)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, state, opt_state, key, loss

    def step(carry, x, y):
        *carry, loss = train_step(*carry, x, y)
        return carry, loss

    def make_carry(model):
        params, state = model
        return (params, state, opt.init(params), jax.random.PRNGKey(1))

    return Case(
        make_model=lambda seed: init(jax.random.PRNGKey(seed)),
        make_model_abstract=lambda seed: jax.eval_shape(init, jax.random.PRNGKey(seed)),
        make_model_jit=lambda seed: jax.jit(init)(jax.random.PRNGKey(seed)),
        make_carry=make_carry,
        step=step,
        count_params=lambda model: count_params(model[0]),
        wait=wait,
        channels_last=True,
    )
