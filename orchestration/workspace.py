"""The scheduled retrain's isolated workspace: a git worktree of HEAD sharing the DVC cache.

A retrain must not touch the user's checkout (their uncommitted edits, their models), and two
retrains must not share a workspace. :func:`create` adds a ``git worktree`` of the commit the
user's checkout is at, on a new branch ``retrain/<run>``, in a folder under
``.prefect-run/workspaces/`` (git-ignored), and points its DVC cache at the project's own
(``.dvc/config.local``: ``cache.dir``), so every stage that has not changed comes out of the
cache (``dvc checkout``, hard links where the file system allows) instead of running again.

The results come back as git: :func:`commit` records ``dvc.lock`` and the run's metrics on the
run's branch, :func:`fast_forward` moves the user's branch to it only when their checkout is
clean and still at the commit the run started from, and :func:`remove` deletes the worktree
(and the branch, when nothing was committed on it). Nothing here imports Prefect or runs a
stage: the flow runs them through ``dvc repro`` in the workspace.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestration.dvc_access import dvc_env
from pipeline.errors import PipelineError
from pipeline.registry import git

#: Where workspaces live, below the project root (``.prefect-run/`` is git-ignored).
WORKSPACES = Path(".prefect-run") / "workspaces"
#: The branch a run's results are committed on.
BRANCH_PREFIX = "retrain/"
#: Link types DVC tries, in order, for files it checks out of the shared cache.
CACHE_TYPES = "reflink,hardlink,copy"


@dataclass(frozen=True)
class Workspace:
    """One run's worktree.

    Attributes:
        root: the user's checkout (the project the run was started for).
        path: the worktree.
        branch: ``retrain/<run>``, created at ``start``.
        start: the commit the run reproduces (the user's HEAD when it began).
    """

    root: Path
    path: Path
    branch: str
    start: str


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``dvc <args>`` in ``cwd`` with the flow's environment (output captured)."""
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=dvc_env(),
                          capture_output=True, text=True)
    if check and done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PipelineError(f"dvc {' '.join(args)} failed in {cwd}: {last[0]}")
    return done


def safe_name(run_name: str) -> str:
    """A branch- and folder-safe name: ``retrain/<this>``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", run_name).strip("-") or "run"


def create(root: Path, run_name: str) -> Workspace:
    """A worktree of ``root``'s HEAD on branch ``retrain/<run>``, using ``root``'s DVC cache.

    Raises:
        PipelineError: ``root`` has no commit, or the branch or folder exists already.
    """
    root = root.resolve()
    start = git(root, "rev-parse", "--verify", "HEAD").strip()
    name = safe_name(run_name)
    path = root / WORKSPACES / name
    if path.exists():
        raise PipelineError(f"workspace {path} exists already (an earlier run of the same "
                            "name, kept after a failure); remove it with git worktree remove")
    cache = dvc(root, "cache", "dir").stdout.strip() or str(root / ".dvc" / "cache")
    path.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "-q", "-b", BRANCH_PREFIX + name, str(path), start)
    config = path / ".dvc" / "config.local"
    config.write_text(f"[cache]\n    dir = {Path(cache).resolve()}\n    type = {CACHE_TYPES}\n"
                      + local_remotes(root))
    return Workspace(root, path, BRANCH_PREFIX + name, start)


def local_remotes(root: Path) -> str:
    """``config.local`` entries pinning each folder remote of ``root`` to its absolute path.

    A folder remote is usually written relative to ``.dvc/`` (the project's default,
    ``../../regrab-dvc-remote``, is a sibling of the checkout); read from a worktree two
    folders deeper, the same words name another folder, and the run would push there. ``dvc
    config --list`` in ``root`` prints every level's settings, one ``key=value`` a line, with
    each folder remote's url resolved as ``root`` reads it (``dvc remote list`` wraps long
    paths over several lines, so it cannot be parsed)."""
    pinned = ""
    for line in dvc(root, "config", "--list").stdout.splitlines():
        key, sep, url = line.strip().partition("=")
        if not sep or not key.startswith("remote.") or not key.endswith(".url"):
            continue
        name = key[len("remote."):-len(".url")]
        if name and "://" not in url:
            pinned += f"['remote \"{name}\"']\n    url = {Path(root, url).resolve()}\n"
    return pinned


def remove(ws: Workspace, keep_branch: bool) -> None:
    """Delete the worktree; delete its branch too unless ``keep_branch``."""
    git(ws.root, "worktree", "remove", "--force", str(ws.path), check=False)
    if ws.path.exists():  # a worktree git no longer knows: remove the folder itself
        shutil.rmtree(ws.path, ignore_errors=True)
    git(ws.root, "worktree", "prune", check=False)
    if not keep_branch:
        git(ws.root, "branch", "-D", ws.branch, check=False)


def _stages(ws: Workspace) -> dict[str, dict]:
    """The stages of the workspace's ``dvc.yaml``, as written (``foreach`` ones unexpanded)."""
    import yaml

    stages = (yaml.safe_load((ws.path / "dvc.yaml").read_text()) or {}).get("stages") or {}
    return {name: spec for name, spec in stages.items() if isinstance(spec, dict)}


def always_changed(ws: Workspace) -> list[str]:
    """The stages marked ``always_changed`` (a check of moving sources): run first, always."""
    return [name for name, spec in _stages(ws).items() if spec.get("always_changed")]


def _resume_state(ws: Workspace) -> dict[str, set[str]]:
    """Per stage, its outputs declared ``persist: true, cache: false`` (resume state)."""
    found: dict[str, set[str]] = {}
    for name, spec in _stages(ws).items():
        for out in spec.get("outs") or []:
            if isinstance(out, dict):
                for path, opts in out.items():
                    if isinstance(opts, dict) and opts.get("persist") and \
                            opts.get("cache") is False:
                        found.setdefault(name, set()).add(path)
    return found


def resume_outputs(ws: Workspace) -> set[str]:
    """Outputs declared ``persist: true, cache: false`` (a stage's resume state, such as
    TransE's checkpoints): neither git nor DVC keeps them, so a new workspace never has them,
    and their absence says nothing about whether the stage's results are current."""
    return set().union(*_resume_state(ws).values())


def resume_stages(ws: Workspace) -> set[str]:
    """The stages that declare resume state (:func:`resume_outputs`)."""
    return set(_resume_state(ws))


def _without(entries: list[object], paths: set[str]) -> list[object]:
    """``dvc status --json`` entries of one stage less missing ``paths`` among its outputs."""
    kept: list[object] = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("changed outs"), dict):
            outs = {k: v for k, v in entry["changed outs"].items()
                    if not (k in paths and v in ("deleted", "not in cache"))}
            rest = {k: v for k, v in entry.items() if k != "changed outs"}
            entry = {**rest, **({"changed outs": outs} if outs else {})}
            if not entry:
                continue
        kept.append(entry)
    return kept


def stale_stages(ws: Workspace, ignore: list[str], target: str | None = None
                 ) -> dict[str, object]:
    """``dvc status --json`` of the workspace (of the stage ``target`` alone when given), less
    the ``ignore``d stages and the missing resume state of the others (:func:`resume_outputs`):
    what would run."""
    done = dvc(ws.path, "status", "--json", *([target] if target else []))
    shown = json.loads(done.stdout or "{}")
    resume = resume_outputs(ws)
    stale = {}
    for name, entries in shown.items():
        if name.split(":")[-1] in ignore:
            continue
        left = _without(entries, resume) if isinstance(entries, list) else entries
        if left:
            stale[name] = left
    return stale


def changed_since(ws: Workspace, commit: str, paths: tuple[str, ...]) -> list[str]:
    """Which of ``paths`` differ between ``commit`` and the workspace's start commit."""
    out = git(ws.path, "diff", "--name-only", commit, ws.start, "--", *paths)
    return [line for line in out.splitlines() if line]


def differs_from_start(ws: Workspace, path: str) -> bool:
    """Whether the workspace's ``path`` is not the file of the start commit (or it is new)."""
    try:
        before = git(ws.path, "show", f"{ws.start}:{path}")
    except PipelineError:
        return True
    target = ws.path / path
    return not target.is_file() or target.read_text() != before


def commit(ws: Workspace, message: str, outputs: list[str]) -> str | None:
    """Commit the run's results on the workspace's branch: every tracked file it changed
    (``dvc.lock``, ``.gitignore``) and the ``outputs`` git keeps rather than DVC (metrics,
    tables and plots, new ones included). The new commit, or None when nothing changed."""
    git(ws.path, "add", "-u")
    present = [p for p in dict.fromkeys(["dvc.lock", *outputs]) if (ws.path / p).exists()]
    ignored = set(git(ws.path, "check-ignore", "--", *present, check=False).splitlines()
                  ) if present else set()
    keep = [p for p in present if p not in ignored]
    if keep:
        git(ws.path, "add", "--", *keep)
    if not git(ws.path, "diff", "--cached", "--name-only").strip():
        return None
    git(ws.path, "-c", "user.name=regrab-retrain", "-c", "user.email=regrab-retrain@localhost",
        "commit", "-q", "-m", message)
    return git(ws.path, "rev-parse", "HEAD").strip()


def checkout_state(ws: Workspace) -> str | None:
    """Why the user's checkout cannot be fast-forwarded now (None: it can)."""
    head = git(ws.root, "rev-parse", "HEAD").strip()
    if head != ws.start:
        return f"your checkout moved to {head[:8]} since the run began at {ws.start[:8]}"
    dirty = git(ws.root, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        return f"your checkout has uncommitted changes ({len(dirty.splitlines())} files)"
    if not git(ws.root, "symbolic-ref", "-q", "HEAD", check=False).strip():
        return "your checkout is on a detached HEAD"
    return None


def fast_forward(ws: Workspace) -> str | None:
    """Move the user's branch to the run's commit; None when done, else why not."""
    reason = checkout_state(ws)
    if reason is None:
        git(ws.root, "merge", "-q", "--ff-only", ws.branch)
    return reason


def push(ws: Workspace) -> str:
    """``dvc push`` of the workspace when a remote is configured; a line saying what happened.

    Raises:
        PipelineError: the push failed.
    """
    remotes = dvc(ws.path, "remote", "list").stdout.strip()
    if not remotes:
        return "no DVC remote configured: nothing pushed (dvc remote add -d NAME URL)"
    dvc(ws.path, "push")
    return f"dvc push to {remotes.split()[0]} done"
