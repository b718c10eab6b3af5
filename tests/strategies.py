"""Hypothesis strategies shared by the test modules."""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st


def float_trees(bound: float, max_leaves: int = 5) -> st.SearchStrategy[Any]:
    """Nested lists and dicts of float32 NumPy arrays (rank 0 to 2) with values in ±`bound`."""
    arrays = hnp.array_shapes(min_dims=0, max_dims=2, max_side=3).flatmap(
        lambda s: hnp.arrays(np.float32, s, elements=st.floats(-bound, bound, width=32))
    )
    return st.recursive(
        arrays,
        lambda children: st.one_of(
            st.lists(children, min_size=1, max_size=3),
            st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=3),
        ),
        max_leaves=max_leaves,
    )
