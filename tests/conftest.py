"""Shared fixtures: the data mirror (from REGRAB_DATA_MIRROR) and tiny FewRel data."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import pytest

from pipeline.config import merged


@pytest.fixture
def upstream():
    """A local HTTP upstream (:mod:`tests.upstream`); tests change what it serves."""
    from tests.upstream import serve

    with serve() as state:
        yield state


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The data mirror folder; tests that need it skip when the variable is unset."""
    value = os.environ.get("REGRAB_DATA_MIRROR")
    if not value:
        pytest.skip("REGRAB_DATA_MIRROR is not set (CI sets it to ../shared/data)")
    path = Path(value)
    assert path.is_dir(), f"REGRAB_DATA_MIRROR={value} is not a folder"
    return path


def fewrel_record(tokens: list[str], head: list[int], tail: list[int],
                  head_id: str = "Q1", tail_id: str = "Q2") -> dict:
    """One FewRel-format record with the given entity token positions."""
    def name(positions: list[int]) -> str:
        return " ".join(tokens[i] if 0 <= i < len(tokens) else "?" for i in positions)

    return {
        "tokens": tokens,
        "h": [name(head), head_id, [head]],
        "t": [name(tail), tail_id, [tail]],
    }


ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _params_yaml() -> dict:
    """params.yaml, read once per session: parsing it takes about 0.1 s, and the schema tests
    ask for it a thousand times (callers get deep copies)."""
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())


def project_params(**sections: dict) -> dict:
    """The project's params.yaml with some sections' keys overridden (values are merged).

    The ``comparison`` section's methods are left out unless ``sections`` names them: they
    would train and be scored beside every toy model of every test; so are the unequal-shot
    settings of ``evaluate`` (toy splits have too few relations for their ways).
    """
    params = copy.deepcopy(_params_yaml())
    params["comparison"]["methods"] = []
    params["evaluate"]["unequal_settings"] = []
    return merged(params, sections)


def section_config(cls, name: str, **overrides):
    """Section ``name`` of params.yaml, with ``overrides``, validated into ``cls``."""
    from pipeline.config import parse_section

    return parse_section(cls, merged(project_params()[name], overrides), name)


def model_config(method: str = "regrab", **overrides):
    """A :class:`model.config.RegrabConfig` from params.yaml's model section."""
    from model.methods.registry import config_for_method

    return config_for_method(merged(project_params()["model"], overrides), method)


#: Fixtures that start a real server: the tests using them are marked ``integration``.
SERVER_FIXTURES = ("prefect_server", "stack_env")


def pytest_configure(config):
    """Under ``make test`` (pytest-xdist, one process per core) each process runs torch on one
    thread: two threads per process on as many processes as cores contended for the cores, and
    their spin-waits cost a third more CPU time."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Mark every test that starts a Prefect server ``integration`` (``make test-slow``), and
    put the tests marked ``long`` first, longest first (the rest keep their order): ``make
    test-slow`` hands whole files to its processes in collection order, so a long file
    started last would keep one process busy long after the other has finished."""
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in SERVER_FIXTURES):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: -long_minutes(item))


def long_minutes(item: pytest.Item) -> float:
    """The minutes a ``long`` mark gives the test (0 without one)."""
    mark = item.get_closest_marker("long")
    if mark is None:
        return 0.0
    minutes = mark.kwargs.get("minutes", mark.args[0] if mark.args else None)
    if not isinstance(minutes, int | float) or minutes <= 0:
        raise pytest.UsageError(f"{item.nodeid}: give long(minutes=N) with N > 0")
    return float(minutes)
