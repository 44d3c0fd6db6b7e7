"""The qsim engine fixture (tests skip where services/qsim is not built)."""

from tests.qsim.conftest import engine  # noqa: F401
