"""The model registry as the commands use it: a model given by name, and the list of versions.

A command that takes a model takes a registry reference in its place: ``--checkpoint`` (or
``--model``) of ``regrab-predict`` and ``regrab-suggest``, ``--models`` of ``regrab-score``.
A value that names no file or folder here and is written as a reference is one:

    regrab                              the promoted version's default model
    regrab@v0.2.0                       that version's
    regrab#prod:fewrel/split_0/regrab   after the colon, the model (predict, suggest)
    regrab@v0.2.0:fewrel                after the colon, the benchmark (score)

It is resolved in the git repository the command runs in (its ``regrab@`` and ``regrab#``
tags), and the model's folder is copied out of DVC (:func:`pipeline.registry.checkout`: the
local cache, else the DVC remote). A file or folder of that name wins over the reference.

:func:`listing` and :func:`format_listing` are ``regrab-models list``: every version with the
headline metrics committed with it, and which one is promoted.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline import registry
from pipeline.errors import PipelineError

#: The benchmarks whose ``metrics/<benchmark>_headline.json`` the listing shows.
BENCHMARKS = ("nyt25", "fewrel")
#: The settings shown of each (REGRAB's accuracy %).
SETTINGS = ("5w1s", "5w5s", "10w1s", "10w5s")
HEADLINE = "metrics/{}_headline.json"
_BENCHMARK = re.compile(r"^[A-Za-z0-9_.-]+$")


def project_root(start: str | Path = ".") -> Path:
    """The top of the git repository ``start`` is in: where the registry's tags are.

    Raises:
        PipelineError: ``start`` is in no git repository, or git is not installed.
    """
    try:
        done = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise PipelineError("git is not installed, and the model registry is git tags; "
                            "install git, or give a checkpoint path instead") from None
    if done.returncode != 0:
        raise PipelineError(
            f"{Path(start).resolve()} is not inside a git repository, so it has no model "
            "registry; run the command in the project's checkout (its regrab@vX.Y.Z tags: "
            "git fetch --tags), or give a checkpoint path instead")
    return Path(done.stdout.strip())


def is_reference(value: str | Path) -> bool:
    """Whether a model option's ``value`` is a registry reference: no file or folder has that
    name, and it is written as one (``regrab``, ``regrab@v1.2.0``, ``regrab#prod``, ...)."""
    text = str(value)
    return not Path(text).exists() and registry.looks_like_ref(text.split(":")[0])


def _line(ref: registry.Ref, version: registry.Version, what: str, path: Path) -> str:
    stage = f" ({', '.join(version.stages)})" if version.stages else ""
    return (f"model {ref.name}{'@' + ref.version if ref.version else '#' + str(ref.stage)}"
            f" = {version.tag}{stage}, commit {version.commit[:7]}: {what}, from {path}")


def checkout_model(value: str | Path, start: str | Path = ".") -> tuple[Path, str | None]:
    """The checkpoint a model option names, and a line saying which version it is.

    A path is returned as it is (the loader says what is wrong with it), with no line; a
    reference is checked out of the registry (:func:`pipeline.registry.checkout`).

    Raises:
        PipelineError: not a git repository, an unknown version, no promoted version, a
            member the version lacks, or bytes neither the DVC cache nor its remote holds.
    """
    if not is_reference(value):
        return Path(value), None
    root = project_root(start)
    ref = registry.parse_ref(str(value))
    version = registry.resolve(root, ref)
    path = registry.checkout(root, ref)
    return path, _line(ref, version, ref.member, _shown(path))


def checkout_benchmark(value: str | Path, start: str | Path = ".") -> tuple[Path, str | None]:
    """The models folder ``regrab-score --models`` names, and a line saying which version.

    ``regrab@v0.2.0:fewrel`` is that version's ``models/fewrel``; with no benchmark,
    the default member's (``nyt25``). A path is returned as it is, with no line.

    Raises:
        PipelineError: as :func:`checkout_model`, and a reference naming one model
            (``:fewrel/split_0/regrab``) where a benchmark is wanted.
    """
    if not is_reference(value):
        return Path(value), None
    name, _, benchmark = str(value).partition(":")
    if benchmark and not _BENCHMARK.match(benchmark):
        raise PipelineError(
            f"--models {value}: regrab-score scores every split and method of one benchmark, "
            f"so after the colon give a benchmark only, e.g. {name}:fewrel (choose methods "
            "with --methods)")
    root = project_root(start)
    ref = registry.parse_ref(name)
    benchmark = benchmark or ref.member.split("/")[0]
    version = registry.resolve(root, ref)
    folder = registry.checkout_benchmark(root, ref, benchmark)
    return folder, _line(ref, version, f"the models of {benchmark}", _shown(folder))


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when it is below it."""
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


@dataclass(frozen=True)
class Row:
    """One version as ``regrab-models list`` shows it.

    Attributes:
        version: the registered version.
        metrics: ``{benchmark: {setting: accuracy %}}`` from the headline files committed
            with it; a benchmark or setting it lacks is missing.
    """

    version: registry.Version
    metrics: dict[str, dict[str, float]]


def headline_at(root: Path, commit: str, benchmark: str) -> dict[str, float]:
    """REGRAB's headline accuracies in ``metrics/<benchmark>_headline.json`` at ``commit``
    (``{setting: %}``); empty when the file is not in that commit or is not such a file."""
    done = subprocess.run(["git", "-C", str(root), "show",
                           f"{commit}:{HEADLINE.format(benchmark)}"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return {}
    try:
        data = json.loads(done.stdout).get(benchmark, {})
    except (ValueError, AttributeError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def listing(root: str | Path, name: str = registry.NAME) -> list[Row]:
    """Every registered version of ``name``, oldest first, with its headline metrics."""
    root = Path(root)
    return [Row(v, {b: headline_at(root, v.commit, b) for b in BENCHMARKS})
            for v in registry.versions(root, name)]


def _accuracies(metrics: dict[str, float]) -> str:
    """``79.24/88.52/68.22/80.39`` (``-`` for a setting missing; ``-`` alone for none)."""
    if not any(s in metrics for s in SETTINGS):
        return "-"
    return "/".join(f"{metrics[s]:.2f}" if s in metrics else "-" for s in SETTINGS)


def format_listing(rows: list[Row], name: str = registry.NAME) -> list[str]:
    """The lines of ``regrab-models list``: a table of versions (``-`` for a metric a version
    did not commit), then which version is promoted and how to use it."""
    if not rows:
        return [f"no version of {name} is registered: the retrain flow registers one after a "
                "run (docs/scheduled-retrains.md), or git fetch --tags to read the team's"]
    head = ["version", "stage", "registered", "commit",
            *(f"{b} {'/'.join(SETTINGS)}" for b in BENCHMARKS)]
    body = [[r.version.version, ",".join(r.version.stages) or "-",
             r.version.created.strftime("%Y-%m-%d %H:%M"), r.version.commit[:7],
             *(_accuracies(r.metrics.get(b, {})) for b in BENCHMARKS)] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in [head, *body]]
    promoted = [r.version for r in rows if registry.PROD in r.version.stages]
    lines.append("accuracy % of REGRAB, from metrics/<benchmark>_headline.json at each "
                 "version's commit (- where it has none)")
    if promoted:
        lines.append(f"promoted ({registry.PROD}): {promoted[0].tag}; --model {name} runs it, "
                     f"--model {name}@vX.Y.Z another version")
    else:
        lines.append(f"no version is promoted: regrab-models promote {name}@vX.Y.Z")
    return lines


def _promoted(root: Path, name: str) -> registry.Version | None:
    try:
        return registry.resolve(root, registry.Ref(name, None, registry.PROD,
                                                   registry.DEFAULT_MEMBER))
    except PipelineError:
        return None


def _changed(before: registry.Version | None, after: registry.Version, verb: str) -> str:
    was = before.tag if before else "none"
    return (f"{verb}: {registry.PROD} was {was}, is now {after.tag} (commit {after.commit[:7]}); "
            f"--model {after.name} runs it; publish the tag to others with git push --tags")


def promote(text: str, start: str | Path = ".") -> str:
    """``regrab-models promote regrab@vX.Y.Z``: assign ``prod`` to that version; the line
    says what changed (nothing, when it is in ``prod`` already).

    Raises:
        PipelineError: not a version reference, or a version that is not registered.
    """
    ref = registry.parse_ref(text)
    if ref.version is None or ":" in text:
        raise PipelineError(f"promote takes one version, {ref.name}@vX.Y.Z (a version is "
                            f"promoted whole, with every model of it), not {text!r}; list "
                            "them with regrab-models list")
    root = project_root(start)
    before = _promoted(root, ref.name)
    target = registry.resolve(root, ref)
    if before is not None and before.version == target.version:
        return f"{target.tag} is in {registry.PROD} already; nothing changed"
    return _changed(before, registry.promote(root, target.version, ref.name), "promoted")


def rollback(start: str | Path = ".", name: str = registry.NAME) -> str:
    """``regrab-models rollback``: give ``prod`` back to the version that held it before the
    one in force; the line says what changed.

    Raises:
        PipelineError: ``prod`` was never held by another version.
    """
    root = project_root(start)
    before = _promoted(root, name)
    return _changed(before, registry.rollback(root, name), "rolled back")


def register(rev: str = "HEAD", start: str | Path = ".", name: str = registry.NAME) -> str:
    """``regrab-models register [REV]``: tag the commit ``rev`` names (``HEAD``, a branch
    such as a scheduled run's ``retrain/<run>``, a hash) as the next version; the line says
    which. It is not promoted: ``regrab-models promote`` does that.

    Raises:
        PipelineError: ``rev`` names no commit, its commit is a version already, or it has no
            ``dvc.lock`` (no models to name).
    """
    root = project_root(start)
    try:
        commit = registry.git(root, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    except PipelineError:
        raise PipelineError(f"{rev!r} names no commit of {root}; give a branch, tag or commit "
                            "(git log --oneline shows them)") from None
    same = [v.tag for v in registry.versions(root, name) if v.commit == commit]
    if same:
        raise PipelineError(f"commit {commit[:7]} is {same[0]} already; promote it with "
                            f"regrab-models promote {same[0]}")
    try:
        registry.git(root, "cat-file", "-e", f"{commit}:dvc.lock")
    except PipelineError:
        raise PipelineError(f"commit {commit[:7]} has no dvc.lock, so it names no models; "
                            "register a commit that dvc repro (or a scheduled run) "
                            "committed") from None
    made = registry.register(root, commit, name=name)
    return (f"registered {made.tag} (commit {commit[:7]}); not promoted: regrab-models "
            f"promote {made.tag} makes it the one --model {name} runs")
