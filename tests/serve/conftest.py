"""The tiny checkpoints, support and queries the service's tests share."""

from tests.serve.test_app import data  # noqa: F401 (a fixture)
