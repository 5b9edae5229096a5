"""Tests for pipeline/sections.py: the registry of params.yaml sections, filled from above."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest
import yaml

import stages
from pipeline import config, sections
from pipeline.errors import PipelineError
from tests.conftest import ROOT, project_params

#: A dotted name of a module above ``pipeline/`` (``stages.fetch``, ``model.config``),
#: not a word ending a sentence ("between stages.") nor a file name (``model.safetensors``).
ABOVE = re.compile(r"(?<![\w./])(stages|model|scripts|cli)\.(?!(safetensors|json|pt)\b)[A-Za-z_]")


def test_pipeline_names_no_module_above_it():
    """Not in an import, not in a string: the registry is filled from above."""
    named = {f"{p.relative_to(ROOT)}:{i}": line.strip()
             for p in sorted((ROOT / "pipeline").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if ABOVE.search(line)}
    assert named == {}


def test_catalog_owners_register_their_sections():
    """Each module the catalog names registers the sections declared for it, and only those."""
    found = sections.all_sections()
    assert set(found) == set(stages.SECTION_OWNERS)
    for name, owner in stages.SECTION_OWNERS.items():
        assert found[name].schema.__module__ == owner, name
    assert set(project_params()) == set(found)


def test_loading_every_schema_leaves_the_environment_alone():
    """The override checks run in the flow's process: a schema module must not set
    variables (OMP_WAIT_POLICY) that would reach the stages it starts."""
    before = dict(os.environ)
    sections.all_sections()
    assert dict(os.environ) == before


@pytest.fixture
def empty(monkeypatch):
    """A registry with nothing registered or declared, restored afterwards."""
    monkeypatch.setattr(sections, "SECTIONS", {})
    monkeypatch.setattr(sections, "OWNERS", {})
    return sections


def test_register_section_as_decorator_and_call(empty):
    @empty.register_section("one")
    @dataclass(frozen=True)
    class One:
        x: int = config.field(doc="x")

    assert empty.SECTIONS["one"].schema is One and empty.SECTIONS["one"].reader is None
    empty.register_section("two", One, reader=len, entries=True)
    assert empty.SECTIONS["two"] == sections.Section("two", One, len, True)


def test_a_second_schema_for_a_section_is_refused(empty):
    @dataclass(frozen=True)
    class A:
        pass

    @dataclass(frozen=True)
    class B:
        pass

    empty.register_section("s", A)
    with pytest.raises(ValueError, match=r"read by both \S*A and \S*B$"):
        empty.register_section("s", B)


def test_the_same_class_registered_again_is_taken(empty):
    """``python -m stages.fetch`` runs the module as __main__; importing it again registers
    a second class object of the same name."""

    def make() -> type:
        @dataclass(frozen=True)
        class Same:
            pass

        return Same

    first, second = make(), make()
    empty.register_section("s", first)
    empty.register_section("s", second)
    assert empty.SECTIONS["s"].schema is second


def test_declare_sections_refuses_two_owners(empty):
    empty.declare_sections({"s": "a.b"})
    empty.declare_sections({"s": "a.b"})  # declared twice by the same catalog: fine
    with pytest.raises(ValueError, match="owners a.b and c.d"):
        empty.declare_sections({"s": "c.d"})


def test_an_owner_that_does_not_register_is_named(empty):
    empty.declare_sections({"s": "pipeline.errors"})
    with pytest.raises(LookupError, match="pipeline.errors was declared to register"):
        empty.get_section("s")
    assert empty.get_section("no_such") is None


def test_check_section(empty):
    @empty.register_section("s")
    @dataclass(frozen=True)
    class S:
        n: int = config.field(ge=1, doc="n")

    empty.declare_sections({"s": __name__})
    assert config.check_section("s", {"n": 1})
    assert not config.check_section("other", {"n": 1})
    with pytest.raises(PipelineError, match=r"params.yaml s.n = 0: expected a number >= 1"):
        config.check_section("s", {"n": 0})


def test_without_a_catalog_only_the_section_is_checked(empty, tmp_path):
    """A process that declared no catalog (regrab-score) cannot tell a misspelt section."""
    @empty.register_section("s")
    @dataclass(frozen=True)
    class S:
        n: int = config.field(doc="n")

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"s": {"n": 1}, "evalute": {}}))
    assert empty.known_sections() is None
    assert config.load_section(S, "s", path) == S(1)
    empty.declare_sections({"s": __name__})
    with pytest.raises(PipelineError, match=r"unknown section\(s\) \['evalute'\]; the "
                                            r"sections are \['s'\]"):
        config.load_section(S, "s", path)
