"""What a command's model work would cost is measured before it starts: regrab-predict,
regrab-suggest and regrab-fewrel-test refuse a support past half the memory, or encoding and
posterior chains past a week of this machine's time, in one ``error:`` line naming the cost
and the fix (exit 2, nothing written); a long but sane run prints its estimate and a bar.
"""

import json
import os
import signal

import pytest

import pipeline.budget
from cli import fewrel_submission, limits, predict, suggest
from tests.cli.inputs import fewrel_record, one_error, write_predict_inputs
from tests.model.predict.test_predictor import tiny_checkpoint

POSTERIOR = "this checkpoint's posterior (1,000,000,000,000 Langevin steps per chain) would take"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny checkpoint and one whose softmax chain has 10^12 steps (past a week on any
    machine), the 3-way 2-shot predict inputs and a FewRel test input of 4 episodes."""
    root = tmp_path_factory.mktemp("run_bounds")
    rows = write_predict_inputs(root)
    data = {}
    for row in rows:
        data.setdefault(row["relation"], []).append(fewrel_record(row))
    (root / "val.json").write_text(json.dumps(data))
    fewrel_submission.main(["make", "--data", str(root / "val.json"), "--ways", "3", "--shots", "1",
                      "--episodes", "4", "--out", str(root / "test.json"),
                      "--answers", str(root / "gold.json")])
    return {"root": root, "ckpt": tiny_checkpoint(root),
            "endless": tiny_checkpoint(root, steps=10**12, likelihood="softmax"),
            "support": root / "support.jsonl", "queries": root / "queries.jsonl",
            "test": root / "test.json"}


def _predict(files, out, ckpt="ckpt", *extra):
    return ["--checkpoint", str(files[ckpt]), "--support", str(files["support"]),
            "--queries", str(files["queries"]), "--out", str(out), "--device", "cpu", *extra]


def _suggest(files, out, ckpt="ckpt", *extra):
    return ["--checkpoint", str(files[ckpt]), "--support", str(files["support"]),
            "--pool", str(files["queries"]), "--out", str(out), "--device", "cpu", *extra]


def _fewrel(files, out, ckpt="ckpt", *extra):
    return ["predict", "--checkpoint", str(files[ckpt]), "--input", str(files["test"]),
            "--out", str(out), "--device", "cpu", *extra]


COMMANDS = {"suggest": (suggest.main, _suggest), "fewrel-test": (fewrel_submission.main, _fewrel),
            "predict": (predict.main, _predict)}


@pytest.mark.parametrize("command", ["suggest", "fewrel-test"])
def test_a_chain_past_a_week_is_refused_with_its_cost(files, capsys, tmp_path, command):
    main, argv = COMMANDS[command]
    out = tmp_path / "out.jsonl"
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("no answer")))
    signal.alarm(120)  # refused in seconds; started, the chains would run for ages
    try:
        err = one_error(capsys, lambda: main(argv(files, out, "endless")))
    finally:
        signal.alarm(0)
    assert POSTERIOR in err and "measured here" in err and "more than 7.0 days" in err
    assert "use a checkpoint trained with fewer model.langevin.steps" in err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("command", ["predict", "suggest"])
def test_a_support_past_half_the_memory_is_refused_before_it_is_encoded(
        files, capsys, tmp_path, monkeypatch, command):
    main, argv = COMMANDS[command]
    encoded = []
    monkeypatch.setattr("model.predict.predictor.Predictor.set_support",
                        lambda *a, **k: encoded.append(a))
    # A machine of 4 KiB: the 3 ways x 2 padded sentences of the tiny encoder do not fit.
    monkeypatch.setattr(pipeline.budget, "memory", lambda: 4 * 2**10)
    out = tmp_path / "out.jsonl"
    err = one_error(capsys, lambda: main(argv(files, out)))
    assert "--support: 3 relations, each padded to the largest one's 2 sentences, would need " \
           "about" in err and "bytes per padded sentence), more than half of this machine's" in err
    assert "give at most 1 relations x sentences of the largest relation" in err
    assert not encoded and not out.exists()
    # The queries' logits grow with --chunk x ways x posterior samples.
    monkeypatch.setattr(pipeline.budget, "memory", lambda: 2**20)
    err = one_error(capsys, lambda: main(argv(files, out, "ckpt", "--chunk", "100000")))
    assert "--chunk 100000 (queries scored at once against 3 relations x 50 posterior " \
           "samples) would need about" in err and "give --chunk 109 or less" in err
    assert not encoded and not out.exists()


@pytest.mark.parametrize("command", ["predict", "suggest", "fewrel-test"])
def test_encoding_past_a_week_is_refused_with_its_cost(files, capsys, tmp_path, monkeypatch,
                                                       command):
    main, argv = COMMANDS[command]
    timed = []

    def seconds(call, repeat=3):
        timed.append(call)
        return 10**6  # seconds for the one sentence timed
    monkeypatch.setattr(limits, "seconds_per_call", seconds)
    monkeypatch.setattr(limits, "TIMED_SENTENCES", 1)  # time the 6 sentences, not skip them
    out = tmp_path / "out.jsonl"
    err = one_error(capsys, lambda: main(argv(files, out)))
    source = "--input's distinct" if command == "fewrel-test" else "--support's"
    assert f"encoding {source} " in err and "would take about" in err
    assert "texts of 11.6 days each, measured here), more than 7.0 days; give fewer" in err
    assert timed and not out.exists()


@pytest.mark.parametrize("command", ["predict", "suggest", "fewrel-test"])
def test_a_long_run_prints_its_estimate_first(files, capsys, tmp_path, monkeypatch, command):
    main, argv = COMMANDS[command]
    monkeypatch.setattr(limits, "LONG_S", -1.0)  # every run is long
    out = tmp_path / "out.jsonl"
    main(argv(files, out))
    err = capsys.readouterr().err
    estimate = next(line for line in err.splitlines() if line.startswith("estimate: "))
    assert "on this machine (encoding" in estimate and "posterior chains of 3 ways x" in estimate
    assert "measured here); Ctrl-C stops it" in estimate and out.exists()
    if command != "fewrel-test":  # the support's encoding shows a bar (fewrel-test's own)
        assert "encode support: 100%" in err


@pytest.mark.parametrize("flag", ["--relations", "--support", "--pool", "--queries"])
def test_a_fifo_nobody_writes_to_is_refused_not_read(files, capsys, tmp_path, flag):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out.jsonl"
    for command in ("predict", "suggest"):
        main, argv = COMMANDS[command]
        args = argv(files, out)
        if flag not in args and flag != "--relations":
            continue
        if flag in args:
            args[args.index(flag) + 1] = str(fifo)
        else:
            args += [flag, str(fifo)]
        err = one_error(capsys, lambda args=args, main=main: main(args))
        assert f"{fifo} is not a regular file (a pipe, socket or device)" in err, err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--pid2name", "--input", "--checkpoint"])
def test_fewrel_test_refuses_a_fifo(files, capsys, tmp_path, flag):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    out = tmp_path / "out.json"
    args = _fewrel(files, out)
    if flag in args:
        args[args.index(flag) + 1] = str(fifo)
    else:
        args += [flag, str(fifo)]
    err = one_error(capsys, lambda: fewrel_submission.main(args))
    assert str(fifo) in err and not out.exists()


def test_score_of_many_episodes_prints_its_estimate_and_a_bar(files, capsys, tmp_path,
                                                              monkeypatch):
    """regrab-score --episodes 1000000 printed nothing for minutes after the encoder's bars:
    now the chains' estimate first, then a bar of the episodes, in a log too."""
    import shutil

    import yaml

    from cli import score
    from model.evaluation import scoring
    from model.files.checkpoint import MODEL_FILE
    from tests.conftest import project_params

    folder = tmp_path / "models" / "split_0" / "regrab"
    folder.mkdir(parents=True)
    shutil.copy(files["ckpt"], folder / MODEL_FILE)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(evaluate={
        "episodes": 4, "queries": 1, "device": "cpu", "batch_episodes": 2})))
    monkeypatch.setattr(limits, "LONG_S", -1.0)  # every run is long
    monkeypatch.setattr(scoring, "PROGRESS_BATCHES", 2)  # 8 episodes in 4 batches
    score.main(["--data", str(files["root"] / "val.json"), "--models", str(tmp_path / "models"),
                "--out", str(tmp_path / "s"), "--methods", "regrab", "--settings", "3w1s",
                "--params", str(params), "--episodes", "8"])
    err = capsys.readouterr().err  # not a terminal, as a log is not
    estimate = next(line for line in err.splitlines() if line.startswith("estimate: "))
    assert "for the posterior chains (8 episodes x 1 setting(s) x 1 checkpoint(s)" in estimate
    assert "episodes:   0%| " in err and "0/4 [" in err
    assert (tmp_path / "s.json").exists()
