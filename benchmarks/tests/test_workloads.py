"""The benchmark workloads: sizes against PyTorch, the same parameter count in every library,
and random numbers drawn only by the steps that use dropout."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import treemod as tm
from benchmarks import run
from benchmarks.workloads.spec import FRAMEWORKS, describe, expected_params, workloads

from bench_helpers import default_promotion

ROOT = Path(__file__).resolve().parents[2]


# --- the workloads ---------------------------------------------------------------------------


def _torch_params(w: Any) -> int:
    """The same architecture in PyTorch, counted by PyTorch (an independent reference)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    if w.kind == "mlp":
        layers = [nn.Linear(w.width, w.width)]
        layers += [nn.Linear(w.width, w.width) for _ in range(w.depth - 1)]
        model: Any = nn.Sequential(*layers, nn.Linear(w.width, w.classes))
    elif w.kind == "resnet":
        mods: list[Any] = [nn.Conv2d(3, w.widths[0], 3, padding=1, bias=False)]
        mods.append(nn.BatchNorm2d(w.widths[0]))
        cin = w.widths[0]
        for stage, (cout, n) in enumerate(zip(w.widths, w.blocks, strict=True)):
            for b in range(n):
                stride = 2 if stage > 0 and b == 0 else 1
                mods += [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)]
                mods += [nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)]
                if stride != 1 or cin != cout:
                    mods += [nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)]
                cin = cout
        model = nn.Sequential(*mods, nn.Linear(cin, w.classes))
    else:
        layer = nn.TransformerEncoderLayer(
            w.width, w.heads, w.mlp_ratio * w.width, w.dropout, norm_first=True
        )
        # One block, counted `depth` times (building 48 full-size blocks would be slow).
        model = nn.ModuleList(
            [
                nn.Embedding(w.vocab, w.width),
                nn.Embedding(w.seq, w.width),
                nn.LayerNorm(w.width),
                nn.Linear(w.width, w.classes),
            ]
        )
        block = sum(p.numel() for p in layer.parameters())
        return sum(p.numel() for p in model.parameters()) + w.depth * block
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", list(workloads()))
def test_expected_params_match_pytorch(name: str) -> None:
    w = workloads()[name]
    assert expected_params(w) == _torch_params(w)


def test_full_size_resnet18_has_the_published_parameter_count() -> None:
    # The CIFAR ResNet-18 (3x3 stem, widths 64-512): 11,173,962 trainable parameters.
    assert expected_params(workloads()["resnet18"]) == 11_173_962


def _abstract_params(framework: str, w: Any) -> int:
    module = importlib.import_module(f"benchmarks.workloads.{_MODULE[framework]}")
    case = module.build(w)
    with default_promotion():
        model = case.make_model_abstract(0)
        # Concrete zeros in place of the shapes, so the worker's own counting applies unchanged.
        model = jax.tree_util.tree_map(
            lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s,
            model,
        )
    return case.count_params(model)


_MODULE = {
    "jax": "jax_dicts",
    "treemod": "treemod_models",
    "equinox": "equinox_models",
    "nnx": "nnx_models",
    "linen": "linen_models",
    "haiku": "haiku_models",
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", list(workloads(quick=True)))
def test_every_framework_builds_the_same_parameter_count(framework: str, name: str) -> None:
    if run.unavailable(framework):
        pytest.skip(f"{framework}: {run.unavailable(framework)}")
    w = workloads(quick=True)[name]
    assert _abstract_params(framework, w) == expected_params(w), describe(w)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp8", "transformer12"])
def test_only_steps_with_dropout_draw_random_numbers(name: str) -> None:
    """A step splits its key only where the workload needs one: every library does the same
    work (Flax NNX's step, whose keys live in the model, never splits one otherwise).

    Each library has one step for every workload, keyed on `Workload.random`, so the smallest
    workload without dropout and one with it check the property. The step is traced, not
    compiled, on an abstract model and optimiser state (`filter_eval_shape`): a random primitive
    in its jaxpr is what becomes a Threefry hash in the program."""
    from benchmarks.worker import _batch
    from benchmarks.workloads import MODULES

    w = workloads(quick=True)[name]
    assert w.random == (name == "transformer12")
    for fw in FRAMEWORKS:
        if run.unavailable(fw):
            continue
        with default_promotion():
            case = importlib.import_module(MODULES[fw]).build(w)
            # Shapes only: tracing reads no values, and an eager build compiles every initialiser.
            carry = tm.filter_eval_shape(lambda case=case: case.make_carry(case.make_model(0)))
            x, y = _batch(w, w.tiny_batch, case.channels_last)
            # Non-array leaves (activations, dropout rates) are static, as in the libraries' jit.
            text = str(tm.filter_make_jaxpr(case.step)(carry, x, y)[0])
        drawn = "random_bits" in text or "random_split" in text or "threefry" in text
        assert drawn == w.random, f"{fw}/{name}"
