"""treescope's view of treemod models: what a reader must see in the text and HTML renderings.

Counts are computed by hand from the layer sizes; sharing is by array identity."""

from __future__ import annotations

import subprocess
import sys

import jax
import treescope

import treemod as tm
import treemod.nn as nn
from treemod.compat import equinox as eqx


class Net(tm.Module):
    lin: nn.Linear
    norm: nn.BatchNorm
    stack: nn.Stack
    tied: jax.Array
    act: str = tm.field(static=True, default="relu")


def _net() -> Net:
    k1, k2 = jax.random.split(jax.random.key(0))
    lin = nn.Linear(4, 3, key=k1)
    stack = nn.Stack(lambda k: nn.Linear(3, 3, key=k), 5, key=k2)
    return Net(lin, nn.BatchNorm(3), stack, lin.weight)


def _text(x: object) -> str:
    return treescope.render_to_text(x, ignore_exceptions=False)


def test_module_shows_fields_counts_and_static_fields() -> None:
    text = _text(_net())
    # Linear(4, 3): 12 weights + 3 biases; BatchNorm(3): 6 params + 6 state; Stack: 5 * 12.
    # The tied array is counted at both places, as tree_summary does: 15 + 6 + 60 + 12 = 93.
    assert "Net(  # 93 params · 6 state" in text
    assert "lin=Linear(  # 15 params · 60 B" in text
    assert "in_features=4,  # static" in text
    assert "act='relu',  # static" in text
    assert "float32(3, 4)" in text  # arrays summarised with shape and dtype


def test_state_is_marked_apart_from_parameters() -> None:
    # Folded (treescope's layout folds short nodes), a State node is still named as one.
    assert "running_mean=State(value=" in _text(_net())
    text = _text(nn.BatchNorm(3))
    assert "BatchNorm(  # 6 params · 6 state · 48 B" in text
    assert "running_mean=State(" in text
    # Unfolded (in HTML, where a reader can unfold it) it says so, on its own background.
    page = treescope.render_to_html(tm.State(jax.numpy.zeros(3)), compressed=False)
    assert "state, not a parameter: 0 params · 3 state" in page
    assert "#f3e6ff" in page


def test_shared_arrays_are_shown_as_shared() -> None:
    text = _text(_net())
    assert "# shared: also at .tied" in text
    assert "# shared: also at .lin.weight" in text
    assert text.count("shared: also at") == 2  # the bias is not shared


def test_stack_is_one_layer_times_n() -> None:
    text = _text(_net())
    assert "stack=Stack(  # 5 × Linear · 60 params" in text
    assert "layers=5 × Linear(" in text
    assert "shape=(3, 3)" in text and "(5, 3, 3)" not in text  # one layer's shapes


def test_html_rendering_has_names_and_counts() -> None:
    page = treescope.render_to_html(_net(), ignore_exceptions=False, compressed=False)
    for needle in ("Net", "lin", "93 params", "state, not a parameter", "5 × Linear", "static"):
        assert needle in page, needle


def test_compat_modules_render_with_the_same_view() -> None:
    layer = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    text = _text(layer)
    assert "Linear(  # 9 params" in text
    assert "in_features=2,  # static" in text


def test_works_in_either_import_order_and_import_treemod_skips_treescope() -> None:
    for first, second in (("treemod", "treescope"), ("treescope", "treemod")):
        code = (
            f"import sys, jax, {first}, {second}\n"
            "import treemod as tm\n"
            "layer = tm.nn.Linear(2, 3, key=jax.random.key(0))\n"
            "print('# 9 params' in treescope.render_to_text(layer))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "True", out.stderr
    code = "import sys, treemod; print('treescope' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_stack_shows_each_layers_rms() -> None:
    import numpy as np

    net = _net()
    layers = net.stack.layers
    sq = np.asarray(layers.weight, np.float64) ** 2
    sb = np.asarray(layers.bias, np.float64) ** 2
    rms = np.sqrt((sq.reshape(5, -1).sum(1) + sb.reshape(5, -1).sum(1)) / (9 + 3))
    expected = ", ".join(f"{v:.3g}" for v in rms)
    assert f"per-layer RMS: {expected}" in _text(net)


def test_a_config_shows_as_keys_once_and_the_policy_is_visible() -> None:
    import treemod.precision as precision
    from treemod.models import LlamaForCausalLM

    config = {
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    model = LlamaForCausalLM.from_config(config, key=jax.random.key(0))
    text = _text(precision.apply_policy(model))
    assert "object at 0x" not in text
    assert "'vocab_size': 64," in text and text.count("'vocab_size'") == 1
    assert "config=<PretrainedConfig ...>" in text  # the inner model's: the same object
    assert (
        "lm_head=Linear(  # 1,024 params · 4.1 kB · precision policy: computes in bfloat16" in text
    )
