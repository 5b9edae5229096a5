"""A whole params tree checked as every stage will read it: each section with its schema,
then the checks that span sections.

:func:`check_params` validates every section with its registered schema
(:mod:`pipeline.sections`; the catalog of sections must be declared first, as importing
``stages`` does), then runs the checks across sections it is given (the model's, from the
floor above). With overrides (``-S key=value``), only sections that a
known schema reads in the file as it stands are checked, what the overrides touch first, and a
failure names the overrides; without, every section is checked and a section no stage reads is
refused. The ``check_params`` stage runs it on ``params.yaml``; the flow's overrides reach it
through that stage's command.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PipelineError
from pipeline.sections import known_sections

PARAMS_NAME = "params.yaml"
#: One check across sections: (keys read, as section or dotted prefixes; the check of (a
#: params file, the folder the stages run in)). It runs when every section read is ours; a
#: failure names the overrides of those keys.
CrossCheck = tuple[tuple[str, ...], Callable[[Path, Path], Any]]


def _ours(name: str, raw: Any) -> bool:
    """Whether a known schema reads section ``name`` as it stands (else another project's)."""
    from pipeline.config import check_section

    try:
        return check_section(name, raw)
    except PipelineError:
        return False


class _LazyOurs:
    """The sections of ``after`` that a known schema reads as they stand in ``before``
    (:func:`_ours`), each found out when first asked (``name in ours``)."""

    def __init__(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        self.before, self.after, self.seen = before, after, {}

    def __contains__(self, name: object) -> bool:
        if name not in self.seen:
            self.seen[name] = (name in self.after and name in self.before
                               and _ours(str(name), self.before[name]))
        return self.seen[name]


def check_params(before: dict[str, Any], after: dict[str, Any], changed: dict[str, str],
                 root: Path, cross_checks: list[CrossCheck]) -> None:
    """Check ``after`` (``before`` with overrides) as every stage will read it.

    With overrides, only sections that a known schema reads in ``before`` are checked: a
    section of another project's file is left to its own stage. Without (``changed`` empty,
    the DVC stage), every section is checked and one no stage reads is refused.

    Args:
        before: the params tree as in the file.
        after: the same with the overrides applied.
        changed: ``{key: "-S key=value"}`` of the overrides, to name in the message; empty
            when ``after`` is the file as it stands.
        root: the folder the stages run in (relative paths are found from there).
        cross_checks: the checks that span sections, in the order they run.

    Raises:
        PipelineError: ``-S key=value: what the stage would say; change the override`` (without
            overrides: ``what the stage would say; fix params.yaml``).
    """
    from pipeline.config import check_section

    if changed:
        # Asked section by section, as the checks need it: asking imports the schema.
        ours: Any = _LazyOurs(before, after)
    else:  # the file as it stands: every section is ours, and each must be known
        known = known_sections() or set()
        stray = sorted(name for name in after if name not in known)
        if stray:
            raise PipelineError(f"{PARAMS_NAME} has section(s) {', '.join(stray)} that no "
                                f"stage reads; fix the name or remove them "
                                f"(known: {', '.join(sorted(known))})")
        ours = set(after)

    def fail(read: tuple[str, ...], exc: PipelineError) -> PipelineError:
        reason = str(exc).removesuffix("; fix params.yaml")
        # The overrides the message names, else those of the keys the check reads.
        given = [text for key, text in changed.items() if key in reason] or [
            text for key, text in changed.items()
            if any(key == p or key.startswith(f"{p}.") for p in read)]
        if not changed:  # the file as it stands (the DVC stage)
            return PipelineError(f"{reason}; fix {PARAMS_NAME}")
        given = " ".join(given or changed.values())
        return PipelineError(f"{given}: {reason}; change the override")

    def touched(read: tuple[str, ...]) -> bool:
        return any(key == p or key.startswith(f"{p}.") or p.startswith(f"{key}.")
                   for key in changed for p in read)

    def section(name: str) -> None:
        try:
            check_section(name, after[name])
        except PipelineError as exc:
            raise fail((name,), exc) from None

    def applies(read: tuple[str, ...]) -> bool:
        return all(key.split(".")[0] in ours for key in read)

    # What the overrides touch first, its sections then its checks across sections: a bad
    # override is refused before the schemas of the other sections are imported (the
    # model's pull in torch, many seconds on a busy machine).
    first = [n for n in sorted(after) if touched((n,)) and n in ours]
    for name in first:
        section(name)
    with tempfile.TemporaryDirectory(prefix="params-check-") as tmp:
        # The stages' loaders read a file: the same tree, written where nobody else looks.
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(after, sort_keys=False))

        def cross(read: tuple[str, ...], check: Callable[[Path, Path], Any]) -> None:
            try:
                check(path, root)
            except PipelineError as exc:
                raise fail(read, exc) from None

        for read, check in cross_checks:
            if touched(read) and applies(read):
                cross(read, check)
        for name in sorted(after):
            if name not in first and name in ours:
                section(name)
        for read, check in cross_checks:
            if not touched(read) and applies(read):
                cross(read, check)
