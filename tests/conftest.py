"""Shared fixtures: the data mirror (from REGRAB_DATA_MIRROR) and tiny FewRel data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
