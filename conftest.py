"""Apply the test suite's JAX settings (tests/conftest.py) to the doctests in `treemod/` too."""

from tests.conftest import *  # noqa: F403
from tests.conftest import pytest_configure  # noqa: F401
