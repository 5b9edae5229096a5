"""Parameters, the data mirror setting and device choice, in one place.

One config idiom for every ``params.yaml`` section: a frozen dataclass is the schema (names,
types, limits), ``params.yaml`` the one source of values. :func:`parse_section` builds the
dataclass from a section and rejects, with one line naming the key, the value and what is
expected:

* unknown keys and missing keys (dataclasses carry no defaults that could drift);
* wrong types: a string where a number is expected, ``steps: 5.5`` for an integer, a bool
  where a number is expected (``True`` is an ``int`` to Python, never to us);
* values outside the limits declared with :func:`field` (``ge``/``gt``/``le``/``lt``) or
  outside a ``Literal[...]`` type.

PyYAML follows YAML 1.1 and reads ``2e-4`` (no dot) as a string; a float field accepts such
a string when it parses as a number, so ``lr: 2e-4`` works as a user expects.

Which sections exist is :mod:`pipeline.sections`' registry, filled from above. Each field
carries its help (``field(doc=...)``), the source of ``docs/configuration.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from pipeline.errors import PipelineError
from pipeline.sections import get_section, known_sections, register_section

#: Environment variable naming a local folder laid out like ``shared/data``.
MIRROR_ENV = "REGRAB_DATA_MIRROR"

T = TypeVar("T")


def field(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, doc: str = "", match: tuple[str, str] | None = None,
          default: Any = dataclasses.MISSING,
          default_factory: Any = dataclasses.MISSING) -> Any:
    """A schema field: its help text, and numeric limits checked by :func:`parse_section`.

    ``match`` is ``(regular expression, what it accepts in words)`` for a string field whose
    values are a closed set with a pattern (a device: ``cuda:N``).

    ``doc`` is the key's help, from which ``docs/configuration.md`` is generated; every field
    of a params schema has one (a test checks). Leave the default out where you can:
    params.yaml holds every value, and a default could drift from it.
    """
    limits = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"limits": limits, "doc": doc, "match": match})


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> Any:
    """A params file's text parsed, once per text: the params check reads the same file for
    every section and check (35 times: a quarter of its CPU), and each caller gets its own
    copy."""
    return yaml.safe_load(text) or {}


def load_params(path: str | os.PathLike[str] = "params.yaml", section: str | None = None) -> Any:
    """Load ``params.yaml`` (or one raw section of it); see :func:`load_section` for typed."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path} not found; run from the project root or pass --params")
    try:
        params = copy.deepcopy(_parsed(path.read_text()))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise PipelineError(f"{path} is not valid YAML{line}; fix its syntax") from exc
    if not isinstance(params, dict):
        raise PipelineError(f"{path} must be a mapping of sections; see the README")
    if section is None:
        return params
    if section not in params:
        raise PipelineError(f"{path} has no section '{section}'; add it (see the README)")
    return params[section]


def load_section(cls: type[T], section: str, path: str | os.PathLike[str] = "params.yaml") -> T:
    """Read ``section`` of a params file and validate it into ``cls``.

    The file's top-level sections are checked too, against the catalog of sections declared
    from above (:func:`pipeline.sections.declare_sections`; every stage process declares it):
    one that nothing reads (a misspelt ``evalute:``) is refused here, when a stage starts,
    not silently ignored. Without a catalog only ``section`` itself is checked.
    """
    params = load_params(path)
    known = known_sections()
    unknown = sorted(set(params) - known) if known is not None else []
    if unknown:
        raise PipelineError(f"{path} has unknown section(s) {unknown}; the sections are "
                            f"{sorted(known)}")
    if section not in params:
        raise PipelineError(f"{path} has no section '{section}'; add it (see the README)")
    return parse_section(cls, params[section], section)


def parse_section(cls: type[T], raw: Any, where: str) -> T:
    """Build the frozen dataclass ``cls`` from a mapping, validating every key.

    Args:
        cls: a dataclass whose fields (possibly nested dataclasses) are the schema.
        raw: the section as read from YAML.
        where: dotted name used in messages, e.g. ``train`` or ``train_transe.model``.

    Raises:
        PipelineError: one line naming the key, the value and what is expected.
    """
    if not isinstance(raw, Mapping):
        raise PipelineError(
            f"params.yaml {where} = {raw!r}: expected a mapping of keys to values; fix params.yaml"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise PipelineError(
            f"params.yaml {where} has unknown key(s) {unknown}; allowed: {sorted(fields)}"
        )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name not in raw:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            raise PipelineError(f"params.yaml {key} is missing; add it (see params.yaml)")
        value = _coerce(raw[name], hints[name], key)
        _check_limits(value, f.metadata.get("limits", {}), key)
        pattern = f.metadata.get("match")
        if pattern and isinstance(value, str) and not re.fullmatch(pattern[0], value):
            raise _bad(key, value, pattern[1])
        values[name] = value
    try:
        return cls(**values)
    except PipelineError:
        raise
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"params.yaml {where}: {exc}; fix params.yaml") from exc


def _bad(key: str, value: Any, expected: str) -> PipelineError:
    return PipelineError(f"params.yaml {key} = {value!r}: expected {expected}; fix params.yaml")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (and convert lists to tuples)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, key)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is Literal:
        if value not in args:
            raise _bad(key, value, f"one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _bad(key, value, "a list")
        item = args[0] if args else Any
        return tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _bad(key, value, "a mapping")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") if args else v
                for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise _bad(key, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(key, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise _bad(key, value, "a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(key, value, "a number")
        if not math.isfinite(value):
            raise _bad(key, value, "a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _bad(key, value, "a string")
        return value
    if tp is Any:
        return value
    raise TypeError(f"parse_section cannot check annotation {tp!r} of {key}")


#: Each limit :func:`field` takes: how messages and docs write it, and its test.
LIMITS = {"ge": (">=", operator.ge), "gt": (">", operator.gt),
          "le": ("<=", operator.le), "lt": ("<", operator.lt)}


def describe_limits(limits: Mapping[str, float]) -> str:
    """``{"ge": 0, "lt": 1}`` -> ``>= 0 and < 1``."""
    return " and ".join(f"{LIMITS[op][0]} {bound}" for op, bound in limits.items())


def _check_limits(value: Any, limits: dict[str, float], key: str) -> None:
    if not limits or value is None:
        return
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not all(LIMITS[op][1](item, bound) for op, bound in limits.items()):
            raise _bad(key, value, f"a number {describe_limits(limits)}")


def merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in, recursively for nested mappings.

    How a partial params file (a preset, a test's few keys) lays over ``params.yaml``.
    """
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def data_mirror() -> Path | None:
    """The data mirror folder from ``REGRAB_DATA_MIRROR``, or None when unset."""
    value = os.environ.get(MIRROR_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise PipelineError(
            f"{MIRROR_ENV}={value} is not a folder; point it at a copy of shared/data"
        )
    return path


#: The devices an entry point accepts: ``auto`` (CUDA when present), ``cpu``, ``cuda[:N]``.
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
#: ``field(match=DEVICE_FIELD)``: a params key naming a device.
DEVICE_FIELD = (DEVICE.pattern, "auto, cpu, cuda or cuda:N")


def select_device(requested: str = "auto", where: str = "device") -> str:
    """Pick the torch device once at an entry point: CUDA when present, else CPU.

    Args:
        requested: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        where: where the value came from, for the message (``params.yaml train.device``).

    Raises:
        PipelineError: ``requested`` is no such device (``gpu``), or names a GPU that
            this machine lacks.
    """
    import torch

    if not isinstance(requested, str) or not DEVICE.fullmatch(requested):
        raise PipelineError(
            f"{where} '{requested}' is not a device; use auto, cpu, cuda or cuda:N"
        )
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineError(
            f"{where} '{requested}' requested but CUDA is not available; use 'auto' or 'cpu'"
        )
    index = int(requested.partition(":")[2] or 0)
    if requested.startswith("cuda") and index >= torch.cuda.device_count():
        raise PipelineError(
            f"{where} '{requested}' names GPU {index}, but this machine has "
            f"{torch.cuda.device_count()}; use 'cuda' or a lower index"
        )
    return requested


def set_threads(threads: int) -> None:
    """Set torch's intra-op threads at an entry point (0 keeps torch's default)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Benchmark:
    """One entry of ``params.yaml``'s ``benchmarks``: where its splits are, how to name it.

    ``dvc.yaml`` runs ``train`` and ``evaluate`` once per entry (``foreach``), so removing an
    entry skips that benchmark. ``train`` (optional) holds keys of the ``train`` section that
    this benchmark's models train with instead, e.g. more steps where there are more training
    relations; they are checked like the section itself when training starts.
    """

    splits: str = field(doc="folder of the benchmark's splits (split_*/ folders), as the "
                            "split_nyt or split_fewrel stage writes them")
    title: str = field(doc="the benchmark's name in reports and plots")
    train: dict[str, Any] = field(default_factory=dict,
                                  doc="keys of the train section that this benchmark's models "
                                      "train with instead (optional), e.g. more steps where "
                                      "there are more training relations")


def load_benchmarks(path: str | os.PathLike[str] = "params.yaml") -> dict[str, Benchmark]:
    """The ``benchmarks`` section, validated like every other section."""
    return parse_benchmarks(load_params(path, "benchmarks"))


def parse_benchmarks(raw: Any) -> dict[str, Benchmark]:
    """Validate a ``benchmarks`` section (see :func:`load_benchmarks`)."""
    value = _coerce(raw, dict[str, Benchmark], "benchmarks")
    if not value:
        raise PipelineError("params.yaml benchmarks is empty; list nyt25 and/or fewrel")
    return value


def check_section(name: str, raw: Any) -> bool:
    """Validate ``raw`` as ``params.yaml``'s section ``name``, as its stage will.

    Returns:
        False when no schema is known for ``name`` (nothing checked), else True.

    Raises:
        PipelineError: what the stage would say about the section.
    """
    found = get_section(name)
    if found is None:
        return False
    if found.reader is not None:
        found.reader(raw)
    else:
        parse_section(found.schema, raw, name)
    return True


register_section("benchmarks", Benchmark, reader=parse_benchmarks, entries=True)
