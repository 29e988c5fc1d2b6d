"""The service tools (bench serve, reliability, the generation fuzz) are tested against the server's own tiny
checkpoint and in-process app: its fixtures, shared from tests/server/conftest.py."""

from tests.server.conftest import tiny_checkpoint  # noqa: F401  (a fixture, found by name)
