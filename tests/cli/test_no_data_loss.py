"""Commands never destroy a file they were not asked to write.

An export onto a folder holding others' files, an ``--out`` that is an input, an output path
that is a folder, SIGTERM or Ctrl-C mid-write: each ends in one ``error:`` line (exit 2, 130
or 143) with every file as it was and no temporary left behind.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli import fewrel_submission, guard, models, predict, score
from model.files import model_folder
from pipeline.errors import INTERRUPTED, PipelineError
from pipeline.io import atomic_path, atomic_paths
from tests.cli.inputs import one_error as _one_error
from tests.cli.inputs import write_predict_inputs
from tests.model.predict.test_predictor import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint, a 3-way 2-shot support file, three queries, a FewRel-format file."""
    root = tmp_path_factory.mktemp("no_data_loss")
    rows = write_predict_inputs(root)
    fewrel: dict[str, list] = {}
    for r in rows:
        fewrel.setdefault(r["relation"], []).append(
            {"tokens": r["tokens"], "h": ["h", "Q1", [list(range(r["head_start"],
                                                                  r["head_end"]))]],
             "t": ["t", "Q2", [list(range(r["tail_start"], r["tail_end"]))]]})
    (root / "val.json").write_text(json.dumps(fewrel))
    return {"root": root, "ckpt": tiny_checkpoint(root), "support": root / "support.jsonl",
            "queries": root / "queries.jsonl", "val": root / "val.json"}


def _tree(folder: Path) -> dict[str, str | None]:
    """Every path under ``folder`` (hidden ones too) with its text; None for folders."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_text(errors="replace")
            for p in sorted(folder.rglob("*"))}


def _never(*args, **kwargs):
    raise AssertionError("the work started before the outputs were checked")


# ------------------------------------------------------------ 1. export onto a folder


def _stranger(folder: Path) -> dict[str, str | None]:
    """A folder of someone else's files, config.json among them; returns its contents."""
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "theirs"}\n')
    (folder / "notes.txt").write_text("keep")
    (folder / "sub" / "data.csv").write_text("a,b\n")
    return _tree(folder)


def test_export_refuses_a_folder_it_did_not_write(files, tmp_path, capsys):
    out = tmp_path / "theirs"
    before = _stranger(out)
    err = _one_error(capsys, lambda: models.main(["export", str(files["ckpt"]), "--out",
                                                  str(out), "--no-encoder"]))
    assert "not a model folder that regrab-models export wrote" in err and "--force" in err
    assert "'notes.txt'" in err
    assert _tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]


def test_export_force_replaces_only_its_own_files(files, tmp_path, capsys):
    out = tmp_path / "theirs"
    before = _stranger(out)
    ours = {"notes.txt", "sub", "sub/data.csv"}
    models.main(["export", str(files["ckpt"]), "--out", str(out), "--force"])
    got = _tree(out)
    assert {k: v for k, v in got.items() if k in ours} == {k: before[k] for k in ours}
    assert json.loads(got["config.json"])["format"] == model_folder.FOLDER_FORMAT
    assert (out / "encoder" / "config.json").is_file()
    assert predict.Predictor.from_checkpoint(out, "cpu").model  # a usable model folder
    # Again, without the encoder: the old encoder/ goes (it would be loaded), the rest stays.
    models.main(["export", str(files["ckpt"]), "--out", str(out), "--force", "--no-encoder"])
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "model.safetensors", "notes.txt", "sub"]
    assert (out / "sub" / "data.csv").read_text() == "a,b\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]
    # Its own folder with a stranger's file added is no longer only its own.
    err = _one_error(capsys, lambda: models.main(["export", str(files["ckpt"]), "--out",
                                                  str(out)]))
    assert "'notes.txt', 'sub'" in err


def test_export_replaces_a_folder_it_wrote_whole(files, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()  # empty: written into
    models.main(["export", str(files["ckpt"]), "--out", str(out)])
    assert (out / "encoder").is_dir()
    models.main(["export", str(files["ckpt"]), "--out", str(out), "--no-encoder"])
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json",
                                                     "model.safetensors"]
    (out / "notes.txt").write_text("mine now")
    _one_error(capsys, lambda: models.main(["export", str(files["ckpt"]), "--out", str(out)]))
    assert (out / "notes.txt").read_text() == "mine now"
    err = _one_error(capsys, lambda: models.main(["export", str(files["ckpt"]), "--out",
                                                  str(out / "notes.txt")]))
    assert "is a file" in err


def test_export_keeps_a_file_a_user_added_to_its_encoder_folder(files, tmp_path, capsys):
    out = tmp_path / "mine"
    models.main(["export", str(files["ckpt"]), "--out", str(out)])
    (out / "encoder" / "mynotes.txt").write_text("mine")
    before = _tree(out)
    for extra in ([], ["--no-encoder"], ["--force"], ["--force", "--no-encoder"]):
        err = _one_error(capsys, lambda extra=extra: models.main(
            ["export", str(files["ckpt"]), "--out", str(out), *extra]))
        assert "encoder/mynotes.txt" in err and "move" in err, err
        assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    # A folder exported before config.json listed encoder/'s files: the names export writes.
    meta = json.loads((out / "config.json").read_text())
    assert "mynotes.txt" not in meta.pop("encoder_files")
    (out / "config.json").write_text(json.dumps(meta))
    err = _one_error(capsys, lambda: models.main(
        ["export", str(files["ckpt"]), "--out", str(out), "--no-encoder"]))
    assert "encoder/mynotes.txt" in err and "tokenizer" not in err
    # Moved away, the folder is export's own again and replaced whole.
    (out / "encoder" / "mynotes.txt").unlink()
    models.main(["export", str(files["ckpt"]), "--out", str(out), "--no-encoder"])
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json",
                                                     "model.safetensors"]


#: Seconds a child may take to reach a point or to end, even on a machine whose cores are
#: all busy (the slow export sleeps longer still, so a lost signal fails, not hangs).
LOADED_MACHINE_LIMIT = 900

_SLOW_EXPORT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import model.files.model_folder as folder
    from cli import models

    def slow_card(*args):  # the weights are in the temporary folder by now
        Path(sys.argv[1]).write_text("writing")
        time.sleep(3 * 900)

    folder.model_card = slow_card
    models.main(sys.argv[2:])
""")


@pytest.mark.slow  # a Python child that imports torch, three times
@pytest.mark.parametrize(("sig", "code", "words", "force"), [
    (signal.SIGTERM, guard.TERMINATED, "terminated (SIGTERM)", False),
    (signal.SIGINT, INTERRUPTED, "interrupted (Ctrl-C)", False),
    (signal.SIGTERM, guard.TERMINATED, "terminated (SIGTERM)", True),
])
def test_signal_during_export_leaves_no_temporary(files, tmp_path, sig, code, words, force):
    out, flag = tmp_path / "model", tmp_path / "flag"
    before = _stranger(out) if force else None
    cmd = [sys.executable, "-c", _SLOW_EXPORT, str(flag), "export", str(files["ckpt"]),
           "--out", str(out), "--no-encoder", *(["--force"] if force else [])]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # No verdict from the clock: a loaded machine may take minutes to import torch and to
    # unwind. The waits end when the child writes the flag or exits; the limit (far above
    # any load seen) only stops a child that hangs.
    deadline = time.monotonic() + LOADED_MACHINE_LIMIT
    try:
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            subprocess.run(["sleep", "0.1"], check=True)
        assert flag.exists(), proc.communicate()[1][-2000:]
        assert [p.name for p in tmp_path.glob(".model.*.tmp")]  # a write under way
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=LOADED_MACHINE_LIMIT)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr[-2000:]
    assert stderr.count("\n") == 1 and stderr.startswith(f"error: {words}"), stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flag"] + (["model"] if force else [])
    if force:
        assert _tree(out) == before


# --------------------------------------------------------- 2. --out that is an input


def _predict_argv(files, out, queries=None, support=None):
    return ["--checkpoint", str(files["ckpt"]), "--support", str(support or files["support"]),
            "--queries", str(queries or files["queries"]), "--out", str(out), "--device", "cpu"]


def test_predict_out_that_is_an_input_is_refused(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(predict.Predictor, "from_checkpoint", _never)
    q, s = tmp_path / "q.jsonl", tmp_path / "s.jsonl"
    q.write_text(files["queries"].read_text())
    s.write_text(files["support"].read_text())
    (tmp_path / "link").symlink_to(tmp_path)  # the same file through a linked folder
    os.link(q, tmp_path / "hard.jsonl")
    (tmp_path / "soft.jsonl").symlink_to(s)
    cases = [(q, "--queries"), (tmp_path / "link" / "q.jsonl", "--queries"),
             (tmp_path / "sub" / ".." / "q.jsonl", "--queries"),
             (tmp_path / "hard.jsonl", "--queries"), (tmp_path / "soft.jsonl", "--support"),
             (s, "--support")]
    (tmp_path / "sub").mkdir()
    for out, what in cases:
        err = _one_error(capsys, lambda out=out: predict.main(
            _predict_argv(files, out, q, s)))
        assert f"--out {out} is also {what}" in err and "give another --out" in err
    assert q.read_text() == files["queries"].read_text()
    assert s.read_text() == files["support"].read_text()
    assert not list(tmp_path.glob(".*.tmp"))


def test_fewrel_test_outputs_that_are_inputs_are_refused(files, tmp_path, capsys):
    data = tmp_path / "val.json"
    data.write_text(files["val"].read_text())
    same = tmp_path / "test.json"

    def make(out, answers):
        return lambda: fewrel_submission.main(["make", "--data", str(data), "--ways", "2",
                                         "--episodes", "2", "--out", str(out),
                                         "--answers", str(answers)])

    err = _one_error(capsys, make(same, same))
    assert f"--answers {same} is also --out {same}" in err
    assert "is also --data" in _one_error(capsys, make(data, tmp_path / "gold.json"))
    assert "is also --data" in _one_error(capsys, make(same, data))
    err = _one_error(capsys, lambda: fewrel_submission.main(
        ["predict", "--checkpoint", str(files["ckpt"]), "--input", str(data), "--out",
         str(data), "--device", "cpu"]))
    assert "is also --input" in err
    assert data.read_text() == files["val"].read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.json"]


def test_convert_onto_the_file_being_converted_is_refused(tmp_path, capsys):
    old = tmp_path / "model.pt"
    old.write_bytes(b"an old pickle")
    os.link(old, tmp_path / "model.safetensors")  # the default --out, the same file
    for out in ([], ["--out", str(old)]):
        err = _one_error(capsys, lambda out=out: models.main(["convert", str(old), *out]))
        assert "is also the file being converted" in err
    assert old.read_bytes() == b"an old pickle"


def test_score_output_that_is_its_data_is_refused(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(score, "score_table", _never)
    data = tmp_path / "own.json"
    data.write_text(files["val"].read_text())
    err = _one_error(capsys, lambda: score.main(["--data", str(data), "--models",
                                                 str(tmp_path), "--out", str(tmp_path / "own")]))
    assert f"output {data} is also --data {data}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.json"]


# ---------------------------------------------------- 3. an output path that is a folder


@pytest.mark.parametrize("end", [".json", "_report.json", ".md"])
def test_score_output_that_is_a_folder_stops_before_scoring(files, tmp_path, capsys,
                                                            monkeypatch, end):
    monkeypatch.setattr(score, "score_table", _never)
    (tmp_path / f"P{end}").mkdir()
    err = _one_error(capsys, lambda: score.main(["--data", str(files["val"]), "--models",
                                                 str(tmp_path), "--out", str(tmp_path / "P")]))
    assert f"output {tmp_path / f'P{end}'} is a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"P{end}"]


def test_outputs_written_together_are_all_or_none(tmp_path):
    """A folder that appears in place of an output while the work runs: no output is moved."""
    paths = [tmp_path / "a.json", tmp_path / "b.md", tmp_path / "c.json"]
    paths[1].write_text("old")
    with pytest.raises(PipelineError, match="c.json is a folder"):
        with atomic_paths(*paths) as tmps:
            for tmp in tmps:
                tmp.write_text("new")
            paths[2].mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.md", "c.json"]
    assert paths[1].read_text() == "old"


def test_predict_out_that_is_a_folder_stops_before_predicting(files, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.setattr(predict.Predictor, "from_checkpoint", _never)
    out = tmp_path / "preds.jsonl"
    out.mkdir()
    err = _one_error(capsys, lambda: predict.main(_predict_argv(files, out)))
    assert f"output {out} is a folder" in err
    err = _one_error(capsys, lambda: fewrel_submission.main(
        ["make", "--data", str(files["val"]), "--out", str(tmp_path / "t.json"),
         "--answers", str(out)]))
    assert f"--answers {out} is a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preds.jsonl"]


# ------------------------------------------------------------------- 4. SIGTERM


def test_sigterm_unwinds_the_write_and_exits_143(tmp_path, capsys):
    out = tmp_path / "out.json"
    before = signal.getsignal(signal.SIGTERM)

    def work(argv):
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("SIGTERM did not stop the work")

    err = _one_error(capsys, lambda: guard.run_command(work, []), code=143)
    assert err.startswith("error: terminated (SIGTERM)")
    assert list(tmp_path.iterdir()) == [] and signal.getsignal(signal.SIGTERM) is before


def test_same_file_through_links(tmp_path):
    a = tmp_path / "a"
    a.write_text("x")
    (tmp_path / "s").symlink_to(a)
    os.link(a, tmp_path / "h")
    assert guard.same_file(a, tmp_path / "s") and guard.same_file(a, tmp_path / "h")
    assert guard.same_file(tmp_path / "new", tmp_path / "." / "new")  # neither exists yet
    assert not guard.same_file(a, tmp_path / "new")
    guard.refuse_same(a, "--out", {"--other": tmp_path / "new", "--none": None})
    with pytest.raises(PipelineError, match="--out .* is also --in"):
        guard.refuse_same(tmp_path / "s", "--out", {"--in": a})


# ------------------------------------------- 5. an output that is or holds an input


def test_export_into_the_checkpoints_own_folder_is_refused_force_or_not(files, tmp_path,
                                                                         capsys):
    own = tmp_path / "models" / "nyt25" / "split_0" / "regrab"
    own.mkdir(parents=True)
    ckpt = own / "model.safetensors"
    ckpt.write_bytes(files["ckpt"].read_bytes())
    (own / "notes.txt").write_text("keep")
    report = tmp_path / "report.json"
    report.write_text('{"accuracy": {}}')
    before = _tree(tmp_path)
    for out, force in [(own, []), (own, ["--force"]), (own.parent, ["--force"]),
                       (tmp_path, ["--force"]), (own / "sub" / "..", ["--force"])]:
        err = _one_error(capsys, lambda out=out, force=force: models.main(
            ["export", str(ckpt), "--out", str(out), "--no-encoder", "--report", str(report),
             *force]))
        assert f"--out {out} is or holds the checkpoint {ckpt}" in err
        assert "give another --out outside it" in err
    # An input found in --out by its inode (a hard link), and --report inside --out.
    other = tmp_path / "other"
    other.mkdir()
    os.link(ckpt, other / "model.safetensors")
    err = _one_error(capsys, lambda: models.main(
        ["export", str(ckpt), "--out", str(other), "--no-encoder", "--force"]))
    assert "is or holds the checkpoint" in err
    (other / "model.safetensors").unlink()
    (other / "r.json").write_text('{"accuracy": {}}')
    err = _one_error(capsys, lambda: models.main(
        ["export", str(ckpt), "--out", str(other), "--report", str(other / "r.json"),
         "--force", "--no-encoder"]))
    assert "is or holds --report" in err
    (other / "r.json").unlink()
    other.rmdir()
    assert _tree(tmp_path) == before and ckpt.read_bytes() == files["ckpt"].read_bytes()


def _legacy(path: Path, fmt, **extra) -> None:
    import torch

    torch.save({"format": fmt, **extra}, path)


def test_convert_never_replaces_a_different_file(tmp_path, capsys):
    import torch

    old = tmp_path / "state.pt"
    _legacy(old, 1, entity=torch.zeros(2, 3))
    mine = tmp_path / "state.safetensors"
    mine.write_bytes(b"someone's trained state")
    for out in ([], ["--out", str(mine)]):
        err = _one_error(capsys, lambda out=out: models.main(["convert", str(old), *out]))
        assert f"--out {mine} already exists" in err and "--force" in err
    assert mine.read_bytes() == b"someone's trained state"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt", "state.safetensors"]
    mine.unlink()
    models.main(["convert", str(old)])  # new: written
    first = mine.read_bytes()
    models.main(["convert", str(old)])  # the same conversion again: nothing lost
    assert mine.read_bytes() == first
    mine.write_bytes(b"changed since")
    models.main(["convert", str(old), "--force"])  # asked for
    assert mine.read_bytes() == first
    capsys.readouterr()


@pytest.mark.parametrize("fmt", [["regrab-model-2"], {"a": 1}, True, None])
def test_convert_of_a_pickle_whose_format_is_not_a_tag_is_one_line(tmp_path, capsys, fmt):
    old = tmp_path / "model.pt"
    _legacy(old, fmt)
    err = _one_error(capsys, lambda: models.main(["convert", str(old)]))
    assert "is not an older REGRAB model or TransE state" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_export_report_that_is_not_a_report_is_refused(files, tmp_path, capsys):
    folder = tmp_path / "folder.json"
    folder.mkdir()
    garbage, other, listing = (tmp_path / n for n in ("g.json", "o.json", "l.json"))
    garbage.write_bytes(b"\x00\xffnot json")
    other.write_text('{"model_type": "bert"}')
    listing.write_text('{"accuracy": [1, 2]}')
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes to it: read, it would hang
    cases = [(folder, "is a folder"), (garbage, "is not JSON"), (tmp_path / "missing.json",
             "does not exist"), (other, "not a report the evaluate stage wrote"),
             (listing, "not a report the evaluate stage wrote"), (fifo, "not a regular file")]
    for report, words in cases:
        err = _one_error(capsys, lambda report=report: models.main(
            ["export", str(files["ckpt"]), "--out", str(tmp_path / "m"), "--no-encoder",
             "--report", str(report)]))
        assert f"--report {report}" in err and words in err, err
        assert "leave --report out" in err
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.*"))


def test_a_newline_in_an_out_name_is_never_printed_raw(files, tmp_path, capsys):
    out = tmp_path / "m\nerror: fake\x1b[2J"
    models.main(["export", str(files["ckpt"]), "--out", str(out), "--no-encoder"])
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "m\\x0aerror: fake\\x1b[2J" in printed
    (out / "notes").write_text("x")
    err = _one_error(capsys, lambda: models.main(
        ["export", str(files["ckpt"]), "--out", str(out), "--no-encoder"]))
    assert "\\nerror: fake" in err
    out = tmp_path / "p\nerror: fake.jsonl"
    predict.main(_predict_argv(files, out))
    wrote = [line for line in capsys.readouterr().out.splitlines() if "wrote" in line]
    assert wrote == [f"wrote 3 rows to {tmp_path}/p\\x0aerror: fake.jsonl"]


def _handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGTERM (Linux's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1],
                 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


_ENTRY = textwrap.dedent("""
    import atexit, sys, time
    from pathlib import Path
    from cli import entry
    flag = Path(sys.argv.pop(1))
    atexit.register(flag.write_text, "shutdown")  # runs only if Python shuts down normally
    entry.models()
    flag.write_text("returned")  # the entry point returned: what follows stands for a
    time.sleep(120)              # slow shutdown, in which SIGTERM's handler is gone
""")


def _export_with_entry(files, tmp_path):
    out, flag = tmp_path / "model", tmp_path / "flag"
    cmd = [sys.executable, "-c", _ENTRY, str(flag), "export", str(files["ckpt"]), "--out",
           str(out), "--no-encoder"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, out, flag


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_sigterm_while_loading_is_one_line_and_143(files, tmp_path):
    proc, _, _ = _export_with_entry(files, tmp_path)
    try:
        for _ in range(1200):  # until the entry point has installed its handler (or is done)
            if proc.poll() is not None or _handles_sigterm(proc.pid):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == guard.TERMINATED, stderr[-2000:]
    assert stderr == f"error: {guard.TERMINATED_LINE}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_process_ends_with_the_command_leaving_no_moment_without_a_handler(files, tmp_path):
    """Python's shutdown puts SIGTERM's default action back before it frees the modules (a
    second or more with torch loaded): a SIGTERM then killed the process with no line. The
    entry point ends the process where the command ends, so no shutdown runs at all."""
    proc, out, flag = _export_with_entry(files, tmp_path)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0 and stderr == "", stderr[-2000:]
    assert not flag.exists()  # neither the return nor the atexit handler ran
    assert (out / "model.safetensors").is_file() and stdout.startswith("exported ")


_ENCODING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import model.predict.predictor as predictor
    from cli import entry

    flag = Path(sys.argv.pop(1))

    def slow_encode(*args, **kwargs):  # stands for the encoding of a large support
        flag.write_text("encoding")
        for _ in range(9000):
            time.sleep(0.3)

    predictor.encode_all = slow_encode
    entry.predict()
""")


@pytest.mark.slow  # a Python child that imports torch
def test_ctrl_c_stops_predict_started_with_sigint_ignored(files, tmp_path):
    """A command started in the background of a script (``regrab-predict ... &``) inherits
    SIGINT ignored, which Python keeps: a Ctrl-C or ``kill -INT`` mid-encoding then did
    nothing until SIGKILL. The entry point takes SIGINT back."""
    flag, out = tmp_path / "flag", tmp_path / "preds.jsonl"
    cmd = [sys.executable, "-c", _ENCODING, str(flag), *_predict_argv(files, out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + LOADED_MACHINE_LIMIT
    try:
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            subprocess.run(["sleep", "0.1"], check=True)
        assert flag.exists(), proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)  # the encoding would take 45 min
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED, stderr[-2000:]
    assert stderr.count("\n") == 1 and stderr.startswith("error: interrupted"), stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flag"]
