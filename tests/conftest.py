"""Fixtures shared by several test folders."""

pytest_plugins = ["tests.fixtures.toy", "tests.fixtures.sshd"]
