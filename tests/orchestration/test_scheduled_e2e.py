"""The scheduled retrain end to end: the real pipeline at toy size, deployed on a worker.

A fresh clone of this working tree with a toy ``params.yaml`` (``tests/orchestration/
toy_project.py``: every stage shrunk through its own section, one NYT-25 split, REGRAB only,
the installed MiniLM encoder) gets its raw data from a local upstream on 127.0.0.1 that serves
small cuts of the data mirror and a checksum list of them. ``REGRAB_DATA_MIRROR`` is unset in
the worker, so ``check_sources`` follows the Wikidata dump's line in that list and ``fetch``
downloads. A real ``prefect server`` and worker (``scripts/prefect_stack.sh`` of the clone)
run ``regrab-scheduled/weekly``, each run triggered with ``prefect deployment run``:

1. v1: everything is built and promoted (gate: no champion);
2. nothing new: Completed in under 60 s, no stage task but the sources check;
3. v2, more triples and one more relation: detected, retrained, the graph holds the new
   relation, and the gate's paired table says why it is promoted or not;
4. v3, a truncated dump: the run fails at ``fetch`` in one line; the champion and the user's
   checkout are untouched;
5. own relations with shuffled labels: a worse FewRel challenger, not promoted, and the
   webhook receiver gets the decision.

Every server is stopped by the test. Per-phase timings are printed (``-s``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.orchestration import toy_project
from tests.orchestration.test_flows_integration import final_states, fresh_clone, prefect_stack
from tests.orchestration.test_outcome import Receiver
from tests.upstream import serve

pytestmark = [pytest.mark.integration, pytest.mark.long(minutes=7)]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", message)


def stack(repo: Path, env: dict[str, str], *args: str, timeout: float) -> str:
    """The clone's own ``scripts/prefect_stack.sh``: its flows, its code."""
    done = subprocess.run(["bash", str(repo / "scripts" / "prefect_stack.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


class Runs:
    """Triggers ``regrab-scheduled/weekly`` and reads back what its run did."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.api = env["PREFECT_API_URL"]

    def trigger(self, timeout_s: float = 900) -> tuple:
        """``prefect deployment run``; the run's final state and its seconds."""
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run",
                              "regrab-scheduled/weekly"], env=self.env, capture_output=True,
                             text=True, timeout=120, check=True).stdout
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
        (states,) = final_states(self.api, [run_id], timeout_s=timeout_s).values()
        return run_id, states[-1], time.monotonic() - start

    def client(self):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        class Client:
            def __enter__(inner):
                inner.settings = temporary_settings(updates={PREFECT_API_URL: self.api})
                inner.settings.__enter__()
                inner.client = get_client(sync_client=True).__enter__()
                return inner.client

            def __exit__(inner, *exc):
                inner.client.__exit__(*exc)
                inner.settings.__exit__(*exc)

        return Client()

    def tasks(self, run_id: str) -> set[str]:
        """Names of the run's task runs (a stage's task is named after its stage)."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        with self.client() as client:
            found = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[run_id])))
        # Prefect names a task run <task>-<3 hex digits>; a stage's task run is the stage.
        return {re.sub(r"-[0-9a-f]{3}$", "", t.name) for t in found}

    def logs(self, run_id: str) -> list[str]:
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        lines: list[str] = []
        with self.client() as client:
            while True:  # the server answers 200 lines at most
                page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                    any_=[run_id])), limit=200, offset=len(lines))
                lines += [log.message for log in page]
                if len(page) < 200:
                    return lines

    def ran(self, run_id: str) -> set[str]:
        """The stages whose command ran (``dvc repro``'s ``Running stage`` lines)."""
        return {m.group(1) for line in self.logs(run_id)
                for m in [re.search(r"Running stage '([^']+)'", line)] if m}

    def artifact(self, run_id: str, key: str):
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        with self.client() as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key])))
        (mine,) = [a for a in found if str(a.flow_run_id) == run_id]
        return mine


def graph_relations(repo: Path, commit: str) -> set[str]:
    """The relations (nodes) of ``data/graph/graph.parquet`` as ``commit``'s dvc.lock has it,
    read from the project's DVC cache."""
    lock = yaml.safe_load(git(repo, "show", f"{commit}:dvc.lock"))
    (md5,) = [out["md5"] for out in lock["stages"]["build_graph"]["outs"]
              if out["path"] == "data/graph/graph.parquet"]
    table = pq.read_table(repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:])
    return set(table.column("src").to_pylist()) | set(table.column("dst").to_pylist())


def user_state(repo: Path) -> tuple[str, str, str]:
    """The user's HEAD, their uncommitted changes, and the commit ``prod`` points at."""
    prod = git(repo, "rev-list", "-n", "1", max(
        (t for t in git(repo, "tag").split() if t.startswith("regrab#prod#")),
        key=lambda t: int(t.rsplit("#", 1)[1])))
    return git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"), prod


def test_scheduled_retrain_on_the_real_pipeline(tmp_path: Path, mirror: Path):
    timings: dict[str, float] = {}
    start = time.monotonic()
    files = toy_project.toy_files(mirror)
    v2 = toy_project.dump_versions(mirror)[1]
    clone = fresh_clone(tmp_path)
    dump = "/" + toy_project.DUMP
    timings["toy data and clone"] = time.monotonic() - start
    with serve() as upstream, Receiver() as hook:
        upstream.files = {"/" + path: body for path, body in files.items()}
        (clone / "params.yaml").write_text(toy_project.toy_params(upstream.base, files))
        commit_all(clone, "toy size, data from the local upstream")
        with prefect_stack(tmp_path / "prefect-run", REGRAB_REPO_DIR=str(clone),
                           REGRAB_RETRAIN_WEBHOOK=hook.url,
                           REGRAB_NETWORK_RETRY_DELAY_S="1") as stack_env:
            env = {**stack_env, "PREFECT_API_URL":
                   f"http://127.0.0.1:{stack_env['PREFECT_PORT']}/api",
                   "PREFECT_HOME": str(tmp_path / "prefect-run" / "home")}
            env.pop("REGRAB_DATA_MIRROR", None)
            t = time.monotonic()
            stack(clone, env, "server-start", timeout=200)
            stack(clone, env, "worker-start", timeout=300)
            timings["server and worker"] = time.monotonic() - t
            runs = Runs(env)

            # 1. v1: the whole pipeline, promoted.
            run, state, timings["v1"] = runs.trigger()
            assert state.name == "Completed", state
            assert state.message == "promoted (gate: no champion)"
            v1_commit = git(clone, "rev-parse", "HEAD")
            assert {"regrab@v0.1.0", "regrab#prod#1"} <= set(
                git(clone, "tag", "--points-at", v1_commit).split())
            assert toy_project.NEW_RELATION not in graph_relations(clone, v1_commit)
            assert hook.received[-1][1]["decision"] == "promoted"

            # 2. Nothing new: no stage runs but the sources check.
            run, state, timings["nothing new"] = runs.trigger()
            assert state.name == "Completed" and state.message.startswith("nothing new"), state
            assert timings["nothing new"] < 60
            assert runs.tasks(run) == {"prepare-workspace", "check_params", "check_sources",
                                       "check-new"}
            assert runs.ran(run) == {"check_sources"}  # always_changed: it always runs
            assert git(clone, "rev-parse", "HEAD") == v1_commit

            # 3. v2: more triples, one more relation.
            upstream.files[dump] = v2
            run, state, timings["v2"] = runs.trigger()
            assert state.name in ("Completed", "Not promoted"), state
            ran = runs.ran(run)
            assert {"check_sources", "fetch", "parse_wikidata", "train_transe", "build_graph",
                    "train@nyt25", "train@fewrel"} <= ran, ran
            assert not {"prepare_fewshot", "split_nyt"} & ran  # FewRel data did not move
            assert "score-champion" in runs.tasks(run)
            gate = runs.artifact(run, "regrab-gate")
            rows = json.loads(gate.data) if isinstance(gate.data, str) else gate.data
            assert {(r["benchmark"], r["setting"]) for r in rows} >= {
                ("nyt25", "5w1s"), ("fewrel", "5w1s"), ("nyt25", "headline")}, rows
            assert state.message in gate.description
            print("v2:", state.message)
            if state.name == "Completed":
                assert state.message.startswith("promoted (gate: passed)")
                v2_commit = git(clone, "rev-parse", "HEAD")
                assert "regrab@v0.2.0" in git(clone, "tag", "--points-at", v2_commit)
            else:
                assert state.message.startswith("not promoted: ")
                (v2_commit,) = [b.strip() for b in git(clone, "branch").splitlines()
                                if "retrain/" in b]
            assert toy_project.NEW_RELATION in graph_relations(clone, v2_commit)
            assert hook.received[-1][1]["summary"] == state.message
            before = user_state(clone)

            # 4. v3, truncated in transit: one line, nothing of the user's touched.
            upstream.files[dump] = v2 + b"\n"  # another version in the checksum list
            upstream.truncate.add(dump)
            run, state, timings["v3 truncated"] = runs.trigger()
            assert state.is_failed(), state
            assert "\n" not in state.message and "failed at fetch" in state.message, state
            assert "error: could not download fetch.files.toy_latest_all" in state.message
            assert "\x1b" not in state.message  # no progress bar in it
            assert user_state(clone) == before
            assert hook.received[-1][1]["decision"] == "failed"
            kept = Path(hook.received[-1][1]["workspace"])
            git(clone, "worktree", "remove", "--force", str(kept))
            upstream.truncate.clear()
            upstream.files[dump] = v2

            # 5. Own relations with shuffled labels: a worse FewRel model, not promoted.
            for path, body in toy_project.own_folder(mirror).items():
                (clone / path).write_bytes(body)
            commit_all(clone, "own relations (labels shuffled)")
            own_commit = git(clone, "rev-parse", "HEAD")
            run, state, timings["shuffled own"] = runs.trigger()
            assert state.name == "Not promoted", state
            assert "fewrel 5w1s" in state.message, state.message
            assert git(clone, "rev-parse", "HEAD") == own_commit
            assert user_state(clone)[2] == before[2]  # prod stays
            payload = hook.received[-1][1]
            assert payload["decision"] == "not promoted" and payload["summary"] == state.message
            (fewrel,) = [r for r in payload["table"]
                         if (r["benchmark"], r["setting"]) == ("fewrel", "5w1s")]
            assert fewrel["diff"] < 0, fewrel
    timings["total"] = time.monotonic() - start
    print("phase timings (s):", {k: round(v, 1) for k, v in timings.items()})
