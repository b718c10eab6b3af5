"""What `import treemod` leaves for later: treemod.nn (imported at the first `tm.nn`) and
jax.extend (which imports Pallas). Import time itself is measured by benchmarks/everyday.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.heavy  # fresh processes or tools


def test_import_treemod_defers_nn_and_jax_extend() -> None:
    code = (
        "import sys, treemod as tm\n"
        "print('treemod.nn' in sys.modules, 'jax.extend' in sys.modules)\n"
        "layer = tm.nn.Linear(2, 3, key=__import__('jax').random.key(0))\n"
        "from treemod import nn\n"
        "print(type(layer).__name__, nn is tm.nn, 'treemod.nn' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["False False", "Linear True True"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import pytest

    import treemod as tm

    with pytest.raises(AttributeError, match=r"module 'treemod' has no attribute 'nope'"):
        tm.nope  # noqa: B018
