"""`DynamicLossScale`'s bounds: the scale never leaves the finite positive range of float32,
and every argument outside it is refused by name."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod.precision as precision

F32_MAX = float(np.finfo(np.float32).max)


def test_growth_stops_at_the_largest_finite_float32_and_halving_recovers() -> None:
    scale = precision.DynamicLossScale(2.0**126, period=1)
    for _ in range(5):
        scale = scale.adjust(jnp.array(True))
        assert math.isfinite(float(scale.scale))
    assert float(scale.scale) == F32_MAX
    halved = scale.adjust(jnp.array(False))
    assert float(halved.scale) == F32_MAX / 2
    # Under jit too, with a factor that overflows at once.
    big = precision.DynamicLossScale(2.0**100, period=1, factor=2.0**60)
    grown = jax.jit(lambda s: s.adjust(jnp.array(True)))(big)
    assert float(grown.scale) == F32_MAX


def test_bad_steps_are_still_skipped_at_the_cap() -> None:
    scale = precision.DynamicLossScale(F32_MAX, period=1)
    grads = scale.unscale({"g": jnp.array([jnp.inf], jnp.float16)})
    finite = precision.all_finite(grads)
    assert not bool(finite)
    kept = precision.select_tree(finite, {"w": jnp.zeros(1)}, {"w": jnp.ones(1)})
    assert float(kept["w"][0]) == 1.0
    assert float(scale.adjust(finite).scale) == F32_MAX / 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": math.inf}, r"`scale` must be positive and finite.*got inf"),
        ({"scale": math.nan}, r"`scale` must be positive and finite.*got nan"),
        ({"scale": 0.0}, r"`scale` must be positive and finite.*got 0.0"),
        ({"scale": -4.0}, r"`scale` must be positive and finite.*got -4.0"),
        ({"scale": 1e39}, r"`scale` must be positive and finite.*float32.*got 1e\+39"),
        ({"scale": "8"}, r"`scale` must be positive and finite.*got '8'"),
        ({"scale": jnp.array(jnp.inf)}, r"`scale` must be positive and finite"),
        ({"min_scale": 0.0}, r"`min_scale` must be positive and finite.*got 0.0"),
        ({"min_scale": -1.0}, r"`min_scale` must be positive and finite.*got -1.0"),
        ({"min_scale": math.nan}, r"`min_scale` must be positive and finite.*got nan"),
        ({"scale": 4.0, "min_scale": 8.0}, r"`min_scale` \(8.0\) is above the initial `scale`"),
        ({"factor": math.inf}, r"`factor` must be above 1 and finite; got inf"),
        ({"period": True}, r"`period` must be a positive int; got True"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="DynamicLossScale: " + message):
        precision.DynamicLossScale(**kwargs)  # type: ignore[arg-type]
