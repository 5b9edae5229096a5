"""The registry of ``params.yaml`` sections, filled from above.

Two things make a section known, and this module names neither (it imports no project
module but :mod:`pipeline.errors`):

* the module that defines a section's frozen dataclass registers it
  (:func:`register_section`, as a decorator), so the schema and its registration sit
  together;
* a catalog above this package declares every section's name and the module that registers
  it (:func:`declare_sections`), so a stage can refuse a misspelt top-level key without
  importing every schema (the model's pull in torch). :func:`get_section` imports an owner
  when its schema is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Section:
    """One ``params.yaml`` section and what reads it.

    Attributes:
        name: the top-level key.
        schema: the frozen dataclass of the section, or of each of its entries when
            ``entries`` (``benchmarks`` maps names to entries).
        reader: validates the raw section or raises ``PipelineError``; None:
            :func:`pipeline.config.parse_section` of ``schema``.
        entries: the section maps names to ``schema`` entries.
    """

    name: str
    schema: type
    reader: Callable[[Any], Any] | None = None
    entries: bool = False


#: The sections' schemas, filled by :func:`register_section` in the modules that define them.
SECTIONS: dict[str, Section] = {}
#: Section -> the module whose import registers its schema (:func:`declare_sections`).
OWNERS: dict[str, str] = {}


def register_section(name: str, schema: type | None = None, *,
                     reader: Callable[[Any], Any] | None = None, entries: bool = False) -> Any:
    """Register ``schema`` as what reads ``params.yaml``'s section ``name``.

    The module that defines a section's dataclass registers it: ``@register_section("fetch")``
    above its ``@dataclass(frozen=True)``.

    Args:
        name: the top-level key of ``params.yaml``.
        schema: the dataclass; left out, a decorator is returned.
        reader: validates the raw section (default: ``parse_section`` of ``schema``).
        entries: ``schema`` is the type of each entry of a mapping, not of the section.

    Raises:
        ValueError: another class already reads ``name``.
    """

    def add(cls: type) -> type:
        old = SECTIONS.get(name)
        # The same class seen twice is one module run as __main__ and imported again.
        if old is not None and old.schema.__qualname__ != cls.__qualname__:
            raise ValueError(f"params.yaml section {name} is read by both "
                             f"{old.schema.__qualname__} and {cls.__qualname__}")
        SECTIONS[name] = Section(name, cls, reader, entries)
        return cls

    return add if schema is None else add(schema)


def declare_sections(owners: Mapping[str, str]) -> None:
    """Declare every section ``params.yaml`` may hold and the module that registers it.

    Called by the catalog of sections, above this package; once it is declared,
    ``load_section`` refuses any other top-level key.

    Raises:
        ValueError: a section is declared again with another owner.
    """
    for name, module in owners.items():
        if OWNERS.setdefault(name, module) != module:
            raise ValueError(f"params.yaml section {name} declared with owners "
                             f"{OWNERS[name]} and {module}")


def known_sections() -> set[str] | None:
    """Every section name ``params.yaml`` may hold; None while no catalog is declared."""
    return set(SECTIONS) | set(OWNERS) if OWNERS else None


def get_section(name: str) -> Section | None:
    """The section ``name`` (its owner imported when needed), or None when none is known.

    Raises:
        LookupError: the declared owner does not register ``name``.
    """
    if name not in SECTIONS and name in OWNERS:
        importlib.import_module(OWNERS[name])
        if name not in SECTIONS:
            raise LookupError(f"{OWNERS[name]} was declared to register params.yaml section "
                              f"{name}, but does not")
    return SECTIONS.get(name)


def all_sections() -> dict[str, Section]:
    """Every known section, in name order, each owner imported (a schema needs its module)."""
    return {name: found for name in sorted(known_sections() or SECTIONS)
            if (found := get_section(name)) is not None}
