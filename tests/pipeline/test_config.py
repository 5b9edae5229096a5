"""Tests for pipeline/config.py against every params.yaml section's schema.

Each section's frozen dataclass is walked field by field (nested subsections included), so
every key of every section is checked: the project's values parse, and a wrong type, an
unknown key, a value below its limit or a missing key is refused with one line naming the
key and the value.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import yaml

import stages  # noqa: F401  (declares the sections' owners)
from pipeline.config import load_section, parse_section
from pipeline.errors import PipelineError
from pipeline.sections import all_sections
from tests.conftest import ROOT, merged, project_params

#: params.yaml section -> the frozen dataclass that is its schema, as the registry has it;
#: the ``benchmarks`` section is a mapping of entries, tested apart.
SCHEMAS = {name: s.schema for name, s in all_sections().items() if not s.entries}


def schema(section: str) -> type:
    return SCHEMAS[section]


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One non-dataclass field of a section: its path, annotation and limits."""

    section: str
    path: tuple[str, ...]
    tp: Any
    limits: dict

    @property
    def key(self) -> str:
        return ".".join((self.section, *self.path))

    @property
    def scalar(self) -> Any:
        """The annotation without ``| None``; ``None`` when it is not int, float or bool."""
        tp = self.tp
        if typing.get_origin(tp) in (Union, types.UnionType):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = inner[0] if len(inner) == 1 else None
        return tp if tp in (int, float, bool) else None


def _walk(cls: type, section: str, prefix: tuple[str, ...] = ()):
    """Yield ``("leaf", Leaf)`` and ``("sub", path)`` for the fields of ``cls``, recursively."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = (*prefix, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            yield "sub", path
            yield from _walk(hints[f.name], section, path)
        else:
            yield "leaf", Leaf(section, path, hints[f.name], dict(f.metadata.get("limits", {})))


def all_leaves() -> list[Leaf]:
    return [item for s in SCHEMAS for kind, item in _walk(schema(s), s) if kind == "leaf"]


LEAVES = all_leaves()
NUMBERS = [leaf for leaf in LEAVES if leaf.scalar in (int, float)]
INTS = [leaf for leaf in NUMBERS if leaf.scalar is int]
FLOATS = [leaf for leaf in NUMBERS if leaf.scalar is float]
BOOLS = [leaf for leaf in LEAVES if leaf.scalar is bool]
LITERALS = [leaf for leaf in LEAVES if typing.get_origin(leaf.tp) is Literal]
BOUNDED = [leaf for leaf in NUMBERS if "ge" in leaf.limits or "gt" in leaf.limits]
#: Every mapping: each section ``(name, ())`` and each of its nested subsections.
SUBSECTIONS = [
    (s, path) for s in SCHEMAS for path in [(), *(p for k, p in _walk(schema(s), s) if k == "sub")]
]


def ids(leaves: list[Leaf]) -> list[str]:
    return [leaf.key for leaf in leaves]


def section(name: str) -> dict:
    """A deep copy of the project's params.yaml section ``name``."""
    return copy.deepcopy(project_params()[name])


def with_value(leaf: Leaf, value: Any) -> dict:
    raw = section(leaf.section)
    node = raw
    for part in leaf.path[:-1]:
        node = node[part]
    node[leaf.path[-1]] = value
    return raw


def attr(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def rejects(leaf_section: str, raw: dict, *fragments: str) -> str:
    """Parse ``raw``; assert a one-line PipelineError holding every fragment; return it."""
    with pytest.raises(PipelineError) as info:
        parse_section(schema(leaf_section), raw, leaf_section)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_every_params_section_has_a_schema():
    """A new params.yaml section must be registered above (and so tested)."""
    assert set(project_params()) == set(SCHEMAS) | {"benchmarks"}


def _write_benchmarks(tmp_path, value):
    params = project_params()
    params["benchmarks"] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_benchmarks_section_is_validated_by_the_same_code(tmp_path):
    from pipeline.config import Benchmark, load_benchmarks

    ok = load_benchmarks(ROOT / "params.yaml")
    assert set(ok) == {"nyt25", "fewrel"} and isinstance(ok["nyt25"], Benchmark)
    bad = {
        "unknown key": ({"nyt25": {"splits": "s", "title": "t", "seed": 1}}, "seed"),
        "missing key": ({"nyt25": {"splits": "s"}}, "benchmarks.nyt25.title is missing"),
        "wrong type": ({"nyt25": {"splits": 3, "title": "t"}}, "benchmarks.nyt25.splits = 3"),
        "not a mapping": (["nyt25"], "expected a mapping"),
        "empty": ({}, "benchmarks is empty"),
    }
    for what, (value, message) in bad.items():
        with pytest.raises(PipelineError, match=message) as exc:
            load_benchmarks(_write_benchmarks(tmp_path, value))
        assert "\n" not in str(exc.value), what


def test_walk_finds_the_keys_we_rely_on():
    """Guards the parametrisation: these keys must be found and classified."""
    keys = {leaf.key for leaf in BOUNDED if leaf.scalar is int}
    assert {
        "fetch.retries", "split_nyt.min_instances", "train_transe.model.epochs",
        "build_graph.k", "model.langevin.samples", "train.steps", "evaluate.episodes",
    } <= keys
    assert {"train.lr_encoder", "train_transe.model.lr", "fetch.timeout_s"} <= set(ids(FLOATS))
    assert ("model", ("encoder",)) in SUBSECTIONS and ("train_transe", ("model",)) in SUBSECTIONS


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_project_section_parses(name):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())[name]  # not the tests' variant
    config = parse_section(schema(name), raw, name)
    assert isinstance(config, schema(name))
    # And through the file, as the stages read it.
    assert load_section(schema(name), name, ROOT / "params.yaml") == config


@pytest.mark.parametrize("leaf", NUMBERS, ids=ids(NUMBERS))
def test_string_for_number_rejected(leaf):
    rejects(leaf.section, with_value(leaf, "abc"), f"{leaf.key} = 'abc'", "expected")


@pytest.mark.parametrize("leaf", INTS, ids=ids(INTS))
def test_fraction_for_integer_rejected(leaf):
    rejects(leaf.section, with_value(leaf, 5.5), f"{leaf.key} = 5.5", "expected an integer")


@pytest.mark.parametrize("leaf", NUMBERS, ids=ids(NUMBERS))
@pytest.mark.parametrize("value", [True, False])
def test_bool_for_number_rejected(leaf, value):
    rejects(leaf.section, with_value(leaf, value), f"{leaf.key} = {value!r}", "expected")


@pytest.mark.parametrize("leaf", BOOLS, ids=ids(BOOLS))
@pytest.mark.parametrize("value", ["yes", 1])
def test_non_bool_for_bool_rejected(leaf, value):
    rejects(leaf.section, with_value(leaf, value), f"{leaf.key} = {value!r}", "true or false")


@pytest.mark.parametrize("leaf", LITERALS, ids=ids(LITERALS))
def test_value_outside_literal_rejected(leaf):
    rejects(leaf.section, with_value(leaf, "no-such-choice"),
            f"{leaf.key} = 'no-such-choice'", "one of")


def _below(leaf: Leaf) -> list[Any]:
    """Values just under the lower limit, and -1 when that is under it too."""
    if "ge" in leaf.limits:
        bound = leaf.limits["ge"]
        values = [bound - 1 if leaf.scalar is int else bound - 0.5]
    else:
        bound = leaf.limits["gt"]
        values = [bound]
    if -1 < bound:
        values.append(-1)
    return sorted(set(values))


@pytest.mark.parametrize("leaf", BOUNDED, ids=ids(BOUNDED))
def test_value_below_limit_rejected(leaf):
    """Zero or negative counts (and rates, sizes...) are refused, naming the limit."""
    for value in _below(leaf):
        rejects(leaf.section, with_value(leaf, value), f"{leaf.key} = {value!r}", "expected a")


@pytest.mark.parametrize("leaf", FLOATS, ids=ids(FLOATS))
def test_yaml_exponent_string_accepted_for_float(leaf):
    """PyYAML reads ``2e-4`` (no dot) as a string; a float field takes it as the number."""
    text = yaml.safe_load("value: 2e-4")["value"]
    assert text == "2e-4"  # the YAML 1.1 quirk this guards against
    limits = leaf.limits
    if ("ge" in limits and 2e-4 < limits["ge"]) or ("gt" in limits and 2e-4 <= limits["gt"]):
        text = yaml.safe_load("value: 2e1")["value"]  # a field whose limit excludes 2e-4
        assert text == "2e1"
    config = parse_section(schema(leaf.section), with_value(leaf, text), leaf.section)
    got = attr(config, leaf.path)
    assert isinstance(got, float) and got == float(text)


def test_yaml_exponent_in_params_file(tmp_path):
    """End to end: ``lr_encoder: 2e-4`` written in a params file reads as 0.0002."""
    original = (ROOT / "params.yaml").read_text()
    lines = original.splitlines()
    # the train section's (a benchmark's own `train` may set one too, further indented)
    at = [i for i, line in enumerate(lines) if line.startswith("  lr_encoder:")]
    assert len(at) == 1
    lines[at[0]] = "  lr_encoder: 2e-4"
    (tmp_path / "params.yaml").write_text("\n".join(lines) + "\n")
    config = load_section(schema("train"), "train", tmp_path / "params.yaml")
    assert config.lr_encoder == 2e-4


@pytest.mark.parametrize(("name", "path"), SUBSECTIONS,
                         ids=[".".join((s, *p)) for s, p in SUBSECTIONS])
def test_unknown_key_rejected(name, path):
    raw = section(name)
    node = raw
    for part in path:
        node = node[part]
    node["no_such_key"] = 1
    where = ".".join((name, *path))
    rejects(name, raw, f"{where} has unknown key(s) ['no_such_key']")


@pytest.mark.parametrize("leaf", LEAVES, ids=ids(LEAVES))
def test_missing_key_rejected(leaf):
    """No field has a default: params.yaml must spell out every key."""
    raw = section(leaf.section)
    node = raw
    for part in leaf.path[:-1]:
        node = node[part]
    del node[leaf.path[-1]]
    rejects(leaf.section, raw, f"{leaf.key} is missing")


@pytest.mark.parametrize(("name", "path"), [(s, p) for s, p in SUBSECTIONS if p],
                         ids=[".".join((s, *p)) for s, p in SUBSECTIONS if p])
def test_missing_subsection_rejected(name, path):
    raw = section(name)
    node = raw
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    rejects(name, raw, f"{'.'.join((name, *path))} is missing")


def test_section_that_is_not_a_mapping_rejected():
    rejects("train", [1, 2], "params.yaml train = [1, 2]", "mapping")


PRESETS = sorted(p.name for p in ROOT.glob("params-*.yaml"))


def _preset(file: str) -> dict:
    return yaml.safe_load((ROOT / file).read_text())


def _flat(tree: dict, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def test_presets_found():
    assert {"params-gpu.yaml", "params-gpu-mpnet.yaml", "params-paper-gpu.yaml"} <= set(PRESETS)


@pytest.mark.parametrize(("file", "name"),
                         [(f, n) for f in PRESETS for n in sorted(_preset(f))])
def test_preset_overrides_validate(file, name):
    """Each params-*.yaml preset merged into params.yaml gives valid sections with its values."""
    preset = _preset(file)
    if name == "benchmarks":  # a mapping of entries, read by its own function
        from pipeline.config import parse_benchmarks
        config = parse_benchmarks(merged(project_params()[name], preset[name]))
    else:
        assert name in SCHEMAS, f"{file} has a section {name} params.yaml lacks"
        config = parse_section(schema(name), merged(project_params()[name], preset[name]), name)
    for path, value in _flat(preset[name]):
        got = attr(config, path)
        expected = tuple(value) if isinstance(value, list) else value
        assert got == expected, ".".join((file, name, *path))


def _misspelt(tmp_path) -> Path:
    params = project_params()
    params["evalute"] = params["evaluate"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_an_unknown_top_level_section_fails_when_a_stage_starts(tmp_path):
    """A misspelt section is refused by every stage's loader, not only by this test file."""
    with pytest.raises(PipelineError, match=r"unknown section\(s\) \['evalute'\]"):
        load_section(schema("split_nyt"), "split_nyt", _misspelt(tmp_path))


def test_a_stage_process_knows_every_section(tmp_path):
    """``python -m stages.X`` declares the catalog itself: the project's file passes, a
    misspelt section is refused, and no other schema module is imported to know that."""
    path = _misspelt(tmp_path)
    probe = ("import sys; from stages import split_nyt; from pipeline.config import load_section;"
             " load_section(split_nyt.SplitParams, 'split_nyt', sys.argv[1]);"
             " print(sorted(m for m in sys.modules if m.startswith(('model', 'torch'))))")
    ok = subprocess.run([sys.executable, "-c", probe, str(ROOT / "params.yaml")],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "[]"
    bad = subprocess.run([sys.executable, "-m", "stages.split_nyt", "--params", str(path),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode == 2
    assert "unknown section(s) ['evalute']" in bad.stderr
    assert not (tmp_path / "out").exists()


def test_every_field_has_help():
    """Each key of every section (entries of mappings too) says what it is: the help that
    docs/configuration.md is made of."""
    missing = []

    def visit(cls: type, where: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if not f.metadata.get("doc", "").strip():
                missing.append(f"{where}.{f.name} ({cls.__qualname__})")
            tp = hints[f.name]
            if typing.get_origin(tp) is dict:
                tp = typing.get_args(tp)[1]
            if dataclasses.is_dataclass(tp):
                visit(tp, f"{where}.{f.name}")

    for name, found in all_sections().items():
        visit(found.schema, name)
    assert missing == []


def test_load_params_parses_a_text_once_and_hands_out_copies(tmp_path, monkeypatch):
    import yaml

    from pipeline import config

    calls = []
    real = yaml.safe_load
    monkeypatch.setattr(config.yaml, "safe_load", lambda text: calls.append(1) or real(text))
    config._parsed.cache_clear()
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  steps: 3\n")
    first = config.load_params(path)
    first["train"]["steps"] = 99  # a caller's change stays its own
    assert config.load_params(path) == {"train": {"steps": 3}} and len(calls) == 1
    path.write_text("train:\n  steps: 4\n")  # same size, new text: read again
    assert config.load_params(path, "train") == {"steps": 4} and len(calls) == 2
