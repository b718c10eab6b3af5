"""A user's type checker sees every parameter of the per-dimension layers (`Conv2d`, ...).

mypy runs on a user snippet (`helpers.mypy_messages`): a call with an argument of the wrong
type, a misspelt keyword or a missing key is reported, and a correct call is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import mypy_messages, snippet_line

pytestmark = pytest.mark.heavy  # mypy analyses treemod (a minute without its cache)

SNIPPET = """
    import jax
    import treemod as tm

    key = jax.random.key(0)
    tm.nn.Conv2d(3, 8, kernel_size=3, padding="SAME", key=key)  # conv-ok
    tm.nn.Conv2d("3", 8, kernel_size=3, key=key)  # conv-channels
    tm.nn.Conv2d(3, 8, kernel_size=3.0, key=key)  # conv-kernel
    tm.nn.Conv2d(3, 8, kernel_size=3, strides=2, key=key)  # conv-keyword
    tm.nn.Conv2d(3, 8, kernel_size=3)  # conv-no-key
    tm.nn.Conv1d(3, 8, 3, use_bias="no", key=key)  # conv1d-bias
    tm.nn.ConvTranspose3d(3, 8, 3, output_padding="1", key=key)  # conv-transpose
    tm.nn.MaxPool2d(2, stride=2, channels_last=True)  # pool-ok
    tm.nn.MaxPool2d(2, dilation="2")  # max-pool-dilation
    tm.nn.AvgPool1d(2, dilation=2)  # avg-pool-dilation
    tm.nn.AdaptiveAvgPool2d((1, 1), channels_last="yes")  # adaptive
    reveal_type(tm.nn.Conv3d.__init__)  # signature
"""


def test_a_type_checker_sees_the_parameters_of_per_dimension_layers(tmp_path: Path) -> None:
    found = mypy_messages(tmp_path, SNIPPET)

    def at(marker: str) -> str:
        return found.get(snippet_line(SNIPPET, marker), "")

    assert at("conv-ok") == "" and at("pool-ok") == "", found
    for marker in ("conv-channels", "conv-kernel", "conv1d-bias", "conv-transpose"):
        assert "[arg-type]" in at(marker), (marker, found)
    for marker in ("max-pool-dilation", "adaptive"):
        assert "[arg-type]" in at(marker), (marker, found)
    assert 'Unexpected keyword argument "strides"' in at("conv-keyword"), found
    assert 'Unexpected keyword argument "dilation"' in at("avg-pool-dilation"), found
    assert 'Missing named argument "key"' in at("conv-no-key"), found
    # The parameters by name, not `Any`.
    revealed = at("signature")
    for name in (
        "in_channels: int",
        "kernel_size: int | typing.Sequence[int]",
        "key: ",
        "channels_last: bool",
    ):
        assert name in revealed, revealed
