"""scripts/config_docs.py: docs/configuration.md is generated from the schemas, and current."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import field
from scripts import config_docs
from tests.conftest import ROOT
from tests.pipeline.test_config import LEAVES


@pytest.fixture(scope="module")
def page() -> str:
    return config_docs.render()


def test_committed_page_is_current(page):
    """Fails when a schema, its help or params.yaml changed without regenerating the page."""
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == page, "docs/configuration.md is stale; run python scripts/config_docs.py"


def test_every_key_has_a_row_with_its_help_limits_and_value(page):
    for leaf in LEAVES:
        row = next((r for r in page.splitlines() if r.startswith(f"| `{leaf.key}` |")), None)
        assert row is not None, leaf.key
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5 and cells[3], row
        if leaf.limits:
            assert cells[2] == config_docs.describe_limits(leaf.limits), row
        assert cells[4], row  # the project's value


def test_a_value_shown_is_the_one_in_params_yaml(tmp_path, page):
    params = (ROOT / "params.yaml").read_text().replace("  k: 10\n", "  k: 7\n")
    assert "  k: 7\n" in params
    (tmp_path / "params.yaml").write_text(params)
    assert "| `build_graph.k` | int | >= 1 |" in page
    assert "| `10` |" in next(r for r in page.splitlines() if "`build_graph.k`" in r)
    other = config_docs.render(tmp_path / "params.yaml")
    assert "| `7` |" in next(r for r in other.splitlines() if "`build_graph.k`" in r)


def test_check_exits_1_on_a_stale_page_and_write_fixes_it(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert config_docs.main(["--check", "--out", str(out)]) == 1  # missing
    out.write_text("old\n")
    assert config_docs.main(["--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().out
    assert config_docs.main(["--out", str(out)]) == 0
    assert config_docs.main(["--check", "--out", str(out)]) == 0


def test_a_default_and_an_unset_key_are_shown():
    @dataclasses.dataclass(frozen=True)
    class Schema:
        n: int = field(ge=1, doc="a count")
        extra: dict = field(default_factory=dict, doc="optional")

    rows = config_docs.rows(Schema, "s", {"n": 3})
    assert rows == [["`s.n`", "int", ">= 1", "a count", "`3`"],
                    ["`s.extra`", "dict", "", "optional", "not set (default `{}`)"]]
