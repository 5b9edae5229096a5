"""The model registry: versions of the pipeline's models as git tags, in GTO's convention.

A version is a git commit whose ``dvc.lock`` names every model file the pipeline made. It is
registered as the annotated tag ``regrab@vX.Y.Z``; the version users run is the one assigned
to the stage ``prod`` (annotated tags ``regrab#prod#N``; the highest ``N`` is in force). These
are the tags of GTO (iterative's git tag ops), so ``gto show regrab`` and ``gto history regrab``
read the same registry, and a promotion or a roll-back is one tag that ``git push --tags``
publishes. The bytes stay in DVC: a version's files come from the local DVC cache, or are
pulled from the DVC remote when missing.

A reference names a version and, after a colon, one trained model of it
(``<benchmark>/split_<k>/<method>``, default :data:`DEFAULT_MEMBER`):

    regrab                    the promoted version (same as regrab#prod)
    regrab#prod               the version assigned to stage prod
    regrab@v1.2.0             that version
    regrab@v1.2.0:fewrel/split_0/regrab

Users, the serving process and the retrain flow all read versions through this module.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.io import atomic_dir

#: The artifact the pipeline's models are registered as.
NAME = "regrab"
#: The stage whose version users run.
PROD = "prod"
#: The trained model a reference names when it names none: REGRAB on NYT-25's first split.
DEFAULT_MEMBER = "nyt25/split_0/regrab"
#: Where the pipeline writes its models (``models/<member>/model.safetensors``).
MODELS_DIR = "models"
MODEL_FILE = "model.safetensors"
#: Where a version's model folders are copied to be loaded, below the project root.
CHECKOUT_DIR = ".regrab/registry"

_NAME_RE = r"[a-z][a-z0-9-]*"
_REF_RE = re.compile(
    rf"^(?P<name>{_NAME_RE})(?:@(?P<version>v\d+\.\d+\.\d+)|#(?P<stage>[a-z][a-z0-9-]*))?"
    r"(?::(?P<member>[A-Za-z0-9_.-]+/split_\d+/[A-Za-z0-9_-]+))?$"
)
_VERSION_TAG = re.compile(rf"^(?P<name>{_NAME_RE})@(?P<version>v\d+\.\d+\.\d+)$")
_STAGE_TAG = re.compile(rf"^(?P<name>{_NAME_RE})#(?P<stage>[a-z][a-z0-9-]*)#(?P<n>\d+)$")


@dataclass(frozen=True)
class Ref:
    """A parsed reference: an artifact, at most one of a version or a stage, and a member."""

    name: str
    version: str | None
    stage: str | None
    member: str

    def __str__(self) -> str:
        at = f"@{self.version}" if self.version else f"#{self.stage}" if self.stage else ""
        return f"{self.name}{at}:{self.member}"


@dataclass(frozen=True)
class Version:
    """One registered version.

    Attributes:
        name: the artifact (``regrab``).
        version: ``vX.Y.Z``.
        commit: the full hash of the commit the version tag points at.
        created: when the version was registered (the tag's date).
        stages: the stages it is assigned to now (``("prod",)`` for the promoted one).
        message: the version tag's message (the retrain writes its headline there).
    """

    name: str
    version: str
    commit: str
    created: datetime
    stages: tuple[str, ...]
    message: str

    @property
    def tag(self) -> str:
        """``regrab@v1.2.0``."""
        return f"{self.name}@{self.version}"


def looks_like_ref(text: str) -> bool:
    """Whether ``text`` is written as a registry reference rather than a file path."""
    return bool(_REF_RE.match(text)) and ("@" in text or "#" in text or text == NAME
                                          or text.startswith(NAME + ":"))


def parse_ref(text: str) -> Ref:
    """Parse ``regrab``, ``regrab#prod``, ``regrab@v1.2.0``, each optionally ``:member``.

    Raises:
        PipelineError: a reference that is none of these.
    """
    found = _REF_RE.match(text.strip())
    if not found:
        raise PipelineError(
            f"model reference {text!r} is not one the registry reads; write {NAME} (the "
            f"promoted version), {NAME}#{PROD}, {NAME}@v1.2.0, optionally followed by "
            f":benchmark/split_K/method such as :{DEFAULT_MEMBER} (list them: regrab-models "
            "list)")
    stage = found["stage"] or (None if found["version"] else PROD)
    return Ref(found["name"], found["version"], stage, found["member"] or DEFAULT_MEMBER)


def git(cwd: Path, *args: str, check: bool = True) -> str:
    """``git <args>`` in ``cwd``; its stdout.

    Raises:
        PipelineError: git exited non-zero (when ``check``), with its last error line.
    """
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PipelineError(f"git {' '.join(args)} failed in {cwd}: {last[0]}")
    return done.stdout


def _tags(root: Path) -> list[tuple[str, str, datetime, str]]:
    """Every annotated tag: (name, commit it points at, tag date, subject)."""
    out = git(root, "for-each-ref", "refs/tags",
               "--format=%(refname:strip=2)%00%(*objectname)%00%(creatordate:iso-strict)"
               "%00%(contents:subject)")
    rows = []
    for line in out.splitlines():
        parts = line.split("\0")
        if len(parts) == 4 and parts[1]:  # a lightweight tag has no *objectname: not ours
            rows.append((parts[0], parts[1], datetime.fromisoformat(parts[2]), parts[3]))
    return rows


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version[1:].split("."))


def assignments(root: str | Path, name: str = NAME, stage: str = PROD) -> list[str]:
    """The versions assigned to ``stage`` over time, oldest first (one per stage tag)."""
    root = Path(root)
    by_commit: dict[str, list[str]] = {}
    for tag, commit, _, _ in _tags(root):
        found = _VERSION_TAG.match(tag)
        if found and found["name"] == name:
            by_commit.setdefault(commit, []).append(found["version"])
    events = []
    for tag, commit, _, subject in _tags(root):
        found = _STAGE_TAG.match(tag)
        if not (found and found["name"] == name and found["stage"] == stage):
            continue
        named = re.search(r"version (v\d+\.\d+\.\d+)", subject)
        candidates = by_commit.get(commit, [])
        version = named.group(1) if named else (max(candidates, key=_semver)
                                                if candidates else None)
        if version:
            events.append((int(found["n"]), version))
    return [version for _, version in sorted(events)]


def versions(root: str | Path, name: str = NAME) -> list[Version]:
    """Every registered version of ``name``, oldest first by version number."""
    root = Path(root)
    in_force = {}
    stage_names = {m["stage"] for t, *_ in _tags(root)
                   if (m := _STAGE_TAG.match(t)) and m["name"] == name}
    for stage in stage_names:
        history = assignments(root, name, stage)
        if history:
            in_force.setdefault(history[-1], []).append(stage)
    found = []
    for tag, commit, created, subject in _tags(root):
        match = _VERSION_TAG.match(tag)
        if match and match["name"] == name:
            version = match["version"]
            found.append(Version(name, version, commit, created,
                                 tuple(sorted(in_force.get(version, []))), subject))
    return sorted(found, key=lambda v: _semver(v.version))


def resolve(root: str | Path, ref: Ref | str) -> Version:
    """The version a reference names.

    Raises:
        PipelineError: no such version, or no version assigned to the stage named.
    """
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    known = versions(root, ref.name)
    if ref.version:
        for version in known:
            if version.version == ref.version:
                return version
        listed = ", ".join(v.version for v in known) or "none"
        raise PipelineError(f"{ref.name}@{ref.version} is not registered (versions: {listed});"
                            " list them with regrab-models list")
    for version in known:
        if ref.stage in version.stages:
            return version
    raise PipelineError(
        f"no version of {ref.name} is assigned to {ref.stage}: the retrain flow promotes one "
        f"after a run (or regrab-models promote {ref.name}@vX.Y.Z); give a checkpoint path "
        "instead, or fetch the registry's tags (git fetch --tags)")


def next_version(root: str | Path, name: str = NAME) -> str:
    """The next minor version: ``v0.1.0`` first, then ``v0.2.0``, ..."""
    known = versions(root, name)
    if not known:
        return "v0.1.0"
    major, minor, _ = _semver(known[-1].version)
    return f"v{major}.{minor + 1}.0"


def register(root: str | Path, commit: str = "HEAD", message: str = "",
             name: str = NAME, version: str | None = None) -> Version:
    """Tag ``commit`` as the next version of ``name`` (an annotated ``name@vX.Y.Z`` tag)."""
    root = Path(root)
    version = version or next_version(root, name)
    sha = git(root, "rev-parse", "--verify", f"{commit}^{{commit}}").strip()
    text = message or f"Registering artifact {name} version {version}"
    git(root, "tag", "-a", f"{name}@{version}", sha, "-m", text)
    return resolve(root, Ref(name, version, None, DEFAULT_MEMBER))


def promote(root: str | Path, version: str, name: str = NAME, stage: str = PROD) -> Version:
    """Assign ``version`` to ``stage`` (the next ``name#stage#N`` tag); return it."""
    root = Path(root)
    target = resolve(root, Ref(name, version, None, DEFAULT_MEMBER))
    number = 1 + max((int(m["n"]) for t, *_ in _tags(root)
                      if (m := _STAGE_TAG.match(t)) and m["name"] == name
                      and m["stage"] == stage), default=0)
    git(root, "tag", "-a", f"{name}#{stage}#{number}", target.commit, "-m",
         f"Assigning stage {stage} to artifact {name} version {version}")
    return resolve(root, Ref(name, version, None, DEFAULT_MEMBER))


def rollback(root: str | Path, name: str = NAME, stage: str = PROD) -> Version:
    """Assign ``stage`` back to the version it held before the one in force now.

    Raises:
        PipelineError: the stage was never held by another version.
    """
    history = assignments(root, name, stage)
    current = history[-1] if history else None
    earlier = [v for v in history if v != current]
    if not earlier:
        raise PipelineError(f"{name}#{stage} has no earlier version to roll back to "
                            f"(history: {', '.join(history) or 'none'})")
    return promote(root, earlier[-1], name, stage)


def checkout(root: str | Path, ref: Ref | str, dest: str | Path | None = None) -> Path:
    """The checkpoint file of a reference's member, copied out of DVC at its version.

    The member's folder is read from the version's commit through DVC (the local cache, or
    the DVC remote when the cache lacks it) into ``dest`` (default
    ``<root>/.regrab/registry/<name>/<version>/<member>``), once: a folder already there is
    reused. Nothing half-copied is left behind.

    Raises:
        PipelineError: an unknown version or member, or bytes neither the cache nor the remote
            has (the message says to ``dvc push`` from the machine that made them).
    """
    root = Path(root).resolve()
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    version = resolve(root, ref)
    folder = Path(dest) if dest else root / CHECKOUT_DIR / ref.name / version.version / ref.member
    if not (folder / MODEL_FILE).is_file():
        _copy_out(root, version, f"{MODELS_DIR}/{ref.member}", f"model {ref.member}", folder)
    return folder / MODEL_FILE


def checkout_benchmark(root: str | Path, ref: Ref | str, benchmark: str) -> Path:
    """Every trained model of ``benchmark`` at a reference's version (its member is ignored),
    copied out of DVC as :func:`checkout` copies one: the folder
    ``<root>/.regrab/registry/<name>/<version>/benchmark/<benchmark>``, laid out as
    ``models/<benchmark>`` (``split_<k>/<method>/model.safetensors``).

    Raises:
        PipelineError: as :func:`checkout` does.
    """
    root = Path(root).resolve()
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    version = resolve(root, ref)
    folder = root / CHECKOUT_DIR / ref.name / version.version / "benchmark" / benchmark
    if not folder.is_dir():
        _copy_out(root, version, f"{MODELS_DIR}/{benchmark}", f"models of {benchmark}", folder,
                  must_hold=None)
    return folder


#: Parts of a model folder a loader never reads: training curves and the resume point.
_NOT_COPIED = frozenset({"dvclive", "state.safetensors"})


def _copy_out(root: Path, version: Version, source: str, what: str, folder: Path,
              must_hold: str | None = MODEL_FILE) -> None:
    """Copy ``source`` (a folder of ``version``'s outputs) into ``folder`` through DVC, all of
    it or nothing, leaving out :data:`_NOT_COPIED`."""
    from dvc.api import DVCFileSystem  # seconds to import: only when a copy is needed

    fs = DVCFileSystem(str(root), rev=version.commit)
    try:
        wanted = f"{source}/{must_hold}" if must_hold else source
        if not fs.exists(wanted):
            raise PipelineError(
                f"{version.tag} has no {what}: {wanted} is not in that commit's outputs, or "
                "neither the DVC cache nor the DVC remote holds its bytes (dvc push from the "
                "machine that trained it, then try again)")
        with atomic_dir(folder) as tmp:
            for entry in fs.find(source):
                relative = Path(entry).relative_to(source)
                if _NOT_COPIED & set(relative.parts):
                    continue
                target = tmp / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(entry, str(target))
    except PipelineError:
        raise
    except Exception as exc:  # DVC's own errors: missing cache and remote, unreadable rev
        raise PipelineError(
            f"could not read {source} at {version.tag} ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}); "
            "run dvc pull, or dvc push from the machine that trained it") from exc
