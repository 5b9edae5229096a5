import dataclasses

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from model.files.checkpoint import read_checkpoint, save_checkpoint
from model.predict.predictor import Predictor
from model.training import val_scores
from pipeline.errors import PipelineError
from pipeline.io import file_digest
from stages import train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    enc = tiny_encoder(root / "bert")
    splits = toy_splits(root / "splits")
    graph, features = toy_graph(root)
    return root, enc, splits, graph, features


def _params(root, enc, **train_kw):
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1},
                  "langevin": {"samples": 2, "steps": 2}},
        "train": {
            "methods": ["regrab"],
            "steps": 4,
            "ways": [2, 3],
            "shots": [1, 2],
            "queries": 2,
            "val_every": 2,
            "val_episodes": 10,
            "val_settings": ["2w1s"],
            "checkpoint_every": 2,
            "dvclive": False,
            "device": "cpu",
            **train_kw,
        },
    })
    path = root / f"params_{len(list(root.glob('params_*')))}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _run(inputs, out, **kw):
    root, enc, splits, graph, features = inputs
    p = _params(root, enc, **kw)
    return train.main(
        [
            "--splits",
            str(splits),
            "--graph",
            str(graph),
            "--features",
            str(features),
            "--relations",
            str(labels_of(graph)),
            "--out",
            str(out),
            "--params",
            str(p),
        ]
    )


def _weights(path):
    return read_checkpoint(path).state


def test_seeded_runs_repeat_and_skip_when_done(inputs, tmp_path):
    a = _run(inputs, tmp_path / "a")
    _run(inputs, tmp_path / "b")
    wa, wb = (
        _weights(tmp_path / "a/split_0/regrab/model.safetensors"),
        _weights(tmp_path / "b/split_0/regrab/model.safetensors"),
    )
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not (tmp_path / "a/split_0/regrab/state.safetensors").exists()
    best = read_checkpoint(tmp_path / "a/split_0/regrab/model.safetensors")
    assert best.done and best.params["train"]["steps"] == 4
    # The kept model is the best validation point of the history, and says so.
    val = [h["val_acc"] for h in best.history if "val_acc" in h]
    assert len(val) == 2 and a["models"][0]["best_val_acc"] == max(val) == best.val_acc
    assert best.step == 2 * (val.index(max(val)) + 1)
    again = _run(inputs, tmp_path / "a")  # same params: the finished model is kept
    assert again["models"][0] == a["models"][0]
    # No wall-clock time in the outputs: two runs write the same files, byte for byte.
    assert "seconds" not in best.summary
    for name in ("summary.json", "split_0/regrab/model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_the_validation_uncertainty_is_stored_and_changes_nothing_else(inputs, tmp_path,
                                                                       monkeypatch):
    """The best model keeps its uncertainty on the validation relations (2 of them here: 2
    ways, no relation left for outside queries); measuring it leaves the weights, metrics and
    history byte for byte as a run without it writes them, and a rerun adds it to a finished
    model that lacks it."""
    _run(inputs, tmp_path / "with")
    monkeypatch.setattr(val_scores, "measure", lambda run, best: None)
    _run(inputs, tmp_path / "without")
    path = "split_0/regrab/model.safetensors"
    kept = read_checkpoint(tmp_path / "with" / path)
    assert [s.name for s in kept.val_scores] == ["2w1s", "2w5s"]
    assert all(s.default == "max_prob" and "2 validation relations" in s.reason
               for s in kept.val_scores)
    assert read_checkpoint(tmp_path / "without" / path).val_scores is None
    # The support suspicion cutoff, chosen on 2-way 5-shot validation episodes.
    noise = kept.support_noise
    assert (noise.ways, noise.shots, noise.episodes) == (2, 5, 200)
    assert 0 <= noise.flagged_clean <= 100 and "the highest F1" in noise.reason
    save_checkpoint(tmp_path / "stripped", dataclasses.replace(kept, val_scores=None))
    assert (tmp_path / "stripped").read_bytes() == (tmp_path / "without" / path).read_bytes()
    assert (tmp_path / "with/summary.json").read_bytes() == \
        (tmp_path / "without/summary.json").read_bytes()
    # A finished model an older version wrote gets it on the next run, as training gives it.
    monkeypatch.undo()
    _run(inputs, tmp_path / "without")
    assert (tmp_path / "without" / path).read_bytes() == (tmp_path / "with" / path).read_bytes()
    pred = Predictor.from_checkpoint(tmp_path / "with" / path)
    pred.set_support({"P4": ["[E1]w1[/E1] verb4 [E2]w2[/E2] ."], "P5": [], "P6": []},
                     zero_shot=[])
    rule = pred.abstain_rule()
    assert rule.setting.name == "2w1s" and rule.score == "max_prob" and rule.cutoff > 0


def test_two_workers_train_the_same_models_as_one(inputs, tmp_path, caplog):
    """Forked workers start from the same warm cache and seeds: the same weights, bit for
    bit, and the same summary in the same order, whichever worker finished first."""
    caplog.set_level("INFO", logger="stages.train")
    methods = ["regrab", "proto", "proto_label"]
    one = _run(inputs, tmp_path / "one", methods=methods, workers=1)
    two = _run(inputs, tmp_path / "two", methods=methods, workers=2)
    assert "3 models, 3 to train, 2 worker(s)" in caplog.text
    assert [m["method"] for m in two["models"]] == methods
    for a, b in zip(one["models"], two["models"], strict=True):
        assert a == b
    for method in methods:
        wa = _weights(tmp_path / f"one/split_0/{method}/model.safetensors")
        wb = _weights(tmp_path / f"two/split_0/{method}/model.safetensors")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_after_kill_continues_from_saved_step(inputs, tmp_path, monkeypatch):
    root, enc, splits, graph, features = inputs
    _run(inputs, tmp_path / "full")
    original = train.train_one
    seen = []

    def killed(*args, **kw):
        def hook(step):
            seen.append(step)
            if step == 2:
                raise KeyboardInterrupt

        return original(*args, **kw, on_step=hook)

    monkeypatch.setattr(train, "train_one", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(inputs, tmp_path / "killed")
    state = read_checkpoint(tmp_path / "killed/split_0/regrab/state.safetensors")
    assert state.step == 2 and state.resume is not None
    monkeypatch.setattr(train, "train_one", lambda *a, **k: original(*a, **k, on_step=seen.append))
    _run(inputs, tmp_path / "killed")
    assert seen == [1, 2, 3, 4]  # resumed at step 3, not from scratch
    wa = _weights(tmp_path / "full/split_0/regrab/model.safetensors")
    wb = _weights(tmp_path / "killed/split_0/regrab/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nan_loss_stops_with_step_and_checkpoint(inputs, tmp_path, monkeypatch):
    from model.methods.regrab import RegrabHead

    original = RegrabHead.log_predictive
    calls = []

    def poisoned(self, *a, **k):
        out = original(self, *a, **k)
        calls.append(1)
        return out * float("nan") if self.training and len(calls) > 3 else out

    monkeypatch.setattr(RegrabHead, "log_predictive", poisoned)
    with pytest.raises(PipelineError,
                       match=r"at step \d+ .*last good checkpoint: .*state\.safetensors"):
        _run(inputs, tmp_path / "nan")


def test_bad_inputs(inputs, tmp_path):
    with pytest.raises(PipelineError, match="exceed"):
        _run(inputs, tmp_path / "w", ways=[5])
    with pytest.raises(PipelineError, match="K\\+Q"):
        _run(inputs, tmp_path / "k", shots=[11])
    root, enc, splits, graph, features = inputs
    g2, f2 = toy_graph(root / "other", relations=["P90", "P91", "P92"])
    p = _params(root, enc)
    # A graph that shares no relation with the split: REGRAB trains on the fallback prior.
    train.main(
        [
            "--splits",
            str(splits),
            "--graph",
            str(g2),
            "--features",
            str(f2),
            "--relations",
            str(labels_of(g2)),
            "--out",
            str(tmp_path / "g"),
            "--params",
            str(p),
        ]
    )
    assert (tmp_path / "g/split_0/regrab/model.safetensors").exists()


def test_finished_model_is_retrained_when_the_graph_changes(inputs, tmp_path, caplog):
    root, enc, splits, graph, features = inputs
    _run(inputs, tmp_path / "m")
    changed = tmp_path / "graph.parquet"
    table = pq.read_table(graph)
    pq.write_table(table.slice(0, max(1, table.num_rows - 2)), changed)
    p = _params(root, enc)
    with caplog.at_level("INFO"):
        train.main(["--splits", str(splits), "--graph", str(changed), "--features",
                    str(features), "--relations", str(labels_of(graph)),
                    "--out", str(tmp_path / "m"), "--params", str(p)])
    assert "skipped" not in caplog.text
    best = read_checkpoint(tmp_path / "m/split_0/regrab/model.safetensors")
    assert best.params["inputs"]["graph"] == file_digest(changed)


def test_label_prior_is_saved_and_needs_the_relations_table(inputs, tmp_path):
    root, enc, splits, graph, features = inputs
    _run(inputs, tmp_path / "t")
    state = _weights(tmp_path / "t/split_0/regrab/model.safetensors")
    text = state["head.prior.text"]  # (R, D): every toy relation has a label
    assert text.shape[0] == 9 and bool((text.norm(dim=1) > 0).all())
    assert torch.allclose(text.mean(0), torch.zeros(text.shape[1]), atol=1e-5)  # centred
    assert float(state["head.prior.text_gain"]) >= 0
    p = _params(root, enc)
    with pytest.raises(PipelineError, match="--relations"):
        train.main(["--splits", str(splits), "--graph", str(graph), "--features",
                    str(features), "--out", str(tmp_path / "n"), "--params", str(p)])
    off = _params(root, enc)
    params = yaml.safe_load(off.read_text())
    params["model"]["prior"]["text"] = False
    off.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features",
                str(features), "--out", str(tmp_path / "off"), "--params", str(off)])
    assert "head.prior.text" not in _weights(tmp_path / "off/split_0/regrab/model.safetensors")


def test_settings_that_do_not_change_the_model_do_not_retrain(inputs, tmp_path, caplog):
    out = tmp_path / "fp"
    _run(inputs, out, threads=1)
    model = out / "split_0" / "regrab" / "model.safetensors"
    before = model.read_bytes()
    # Threads, respelled floats (a YAML string "2e-4" is the float 2.0e-4), more methods
    # listed, checkpointing and logging settings: the finished model is reused as it is.
    with caplog.at_level("INFO"):
        _run(inputs, out, threads=2, lr_encoder="2e-4", checkpoint_every=3,
             methods=["regrab", "proto"])
    assert model.read_bytes() == before
    assert any("finished model with the same params, skipped" in r.getMessage()
               and "regrab" in r.getMessage() for r in caplog.records)
    # A setting that changes what is learned does retrain.
    _run(inputs, out, lr_encoder=3e-4)
    assert model.read_bytes() != before


def test_wise_ft_saves_the_mix_of_trained_and_pretrained_encoder(inputs, tmp_path):
    """With ``wise_ft`` the saved encoder is alpha * trained + (1 - alpha) * pre-trained, and
    training itself is not changed by the mixing at validation."""
    from model.encoder.sentence import SentenceEncoder

    kw = {"val_every": 4, "steps": 4, "methods": ["proto"]}  # one validation: same best step
    _run(inputs, tmp_path / "plain", wise_ft=1.0, **kw)
    _run(inputs, tmp_path / "mixed", wise_ft=0.25, **kw)
    plain = read_checkpoint(tmp_path / "plain/split_0/proto/model.safetensors")
    mixed = read_checkpoint(tmp_path / "mixed/split_0/proto/model.safetensors")
    assert plain.step == mixed.step == 4
    pre = SentenceEncoder.from_config(plain.config.encoder)
    pre = pre.state_dict()
    names = [k for k in plain.state if k.startswith("encoder.")]
    assert names
    moved = 0
    for k in names:
        w0, w1 = pre[k[len("encoder."):]], plain.state[k]
        assert torch.allclose(mixed.state[k], 0.25 * w1 + 0.75 * w0, atol=1e-6), k
        moved += not torch.allclose(w1, w0)
    assert moved  # training did change the encoder, so the mix is not trivially equal


def test_progress_counts_models_and_estimates_what_is_left(inputs, tmp_path, caplog):
    caplog.set_level("INFO")
    _run(inputs, tmp_path / "p", methods=["proto", "mtb"], steps=2, val_every=2)
    lines = [r.getMessage() for r in caplog.records if " done in " in r.getMessage()]
    # Two workers: either model may finish first.
    assert sorted(ln.split(" done")[0] for ln in lines) == ["split_0/mtb", "split_0/proto"]
    assert "(1 of 2, " in lines[0] and "min left" in lines[0]
    assert "(2 of 2, " in lines[1] and lines[-1].endswith("about 0 min left)")
    caplog.clear()
    _run(inputs, tmp_path / "p", methods=["proto", "mtb"], steps=2, val_every=2)  # reused
    messages = [r.getMessage() for r in caplog.records]
    assert "2 models, 0 to train, 1 worker(s)" in messages
    assert sum("finished model with the same params, skipped" in m for m in messages) == 2
    assert not any(" done in " in m for m in messages)


def test_ways_above_the_training_relations_are_skipped_and_said(inputs, tmp_path, caplog):
    """A benchmark with few training relations (NYT-25: 10) trains on the ways it has room for,
    the same model as without the larger ways listed; the skip is logged."""
    _run(inputs, tmp_path / "a")
    with caplog.at_level("INFO", logger="model.training.loop"):
        _run(inputs, tmp_path / "b", ways=[2, 3, 5])
    a, b = (_weights(tmp_path / run / "split_0/regrab/model.safetensors") for run in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any("train.ways [5] skipped (3 training relations)" in r.getMessage()
               for r in caplog.records)


def _run_with(inputs, out, params):
    root, enc, splits, graph, features = inputs
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(params))
    return train.main(["--splits", str(splits), "--graph", str(graph), "--features",
                       str(features), "--relations", str(labels_of(graph)), "--out", str(out),
                       "--params", str(path)])


def test_comparison_trains_on_episodes_of_at_most_max_ways(inputs, tmp_path):
    """comparison.max_ways drops the larger train.ways for the comparison's methods only: the
    capped model is the one those ways alone train, and the other methods keep every way."""
    root, enc = inputs[0], inputs[1]
    params = yaml.safe_load(_params(root, enc, methods=["regrab"], ways=[2, 3]).read_text())
    params["comparison"] = {"methods": ["proto"], "splits": [], "episodes": 5, "max_ways": 2}
    _run_with(inputs, tmp_path / "capped", params)
    capped = read_checkpoint(tmp_path / "capped/split_0/proto/model.safetensors")
    assert tuple(capped.params["train"]["ways"]) == (2,)
    regrab = read_checkpoint(tmp_path / "capped/split_0/regrab/model.safetensors")
    assert tuple(regrab.params["train"]["ways"]) == (2, 3)
    alone = dict(params, comparison={**params["comparison"], "methods": []})
    alone["train"] = {**params["train"], "methods": ["proto"], "ways": [2]}
    _run_with(inputs, tmp_path / "alone", alone)
    a = _weights(tmp_path / "alone/split_0/proto/model.safetensors")
    assert a.keys() == capped.state.keys()
    assert all(torch.equal(a[k], capped.state[k]) for k in a)
    params["comparison"]["max_ways"] = 1
    with pytest.raises(PipelineError, match=r"comparison.max_ways 1 is below every train.ways"):
        _run_with(inputs, tmp_path / "none", params)


def test_a_benchmark_trains_with_its_own_train_keys(inputs, tmp_path):
    """benchmarks.<name>.train replaces those keys of the train section for that benchmark's
    models only: the same model as a train section that says so, and bad keys are refused."""
    root, enc, splits, graph, features = inputs
    params = yaml.safe_load(_params(root, enc, steps=4).read_text())
    params["benchmarks"] = {"toy": {"splits": str(splits), "title": "toy",
                                    "train": {"steps": 2}},
                            "plain": {"splits": str(splits), "title": "plain"}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))

    def run(out, benchmark, where=path):
        return train.main(["--splits", str(splits), "--graph", str(graph), "--features",
                           str(features), "--relations", str(labels_of(graph)), "--out",
                           str(out), "--params", str(where), "--benchmark", benchmark])

    run(tmp_path / "toy", "toy")
    run(tmp_path / "plain", "plain")
    toy = read_checkpoint(tmp_path / "toy/split_0/regrab/model.safetensors")
    plain = read_checkpoint(tmp_path / "plain/split_0/regrab/model.safetensors")
    assert toy.params["train"]["steps"] == 2 and plain.params["train"]["steps"] == 4
    short = _run(inputs, tmp_path / "short", steps=2)["models"][0]
    want = _weights(tmp_path / "short/split_0/regrab/model.safetensors")
    assert short["steps"] == 2
    assert all(torch.equal(want[k], toy.state[k]) for k in want)
    with pytest.raises(PipelineError, match=r"benchmark 'nyt25' is not in .* \['plain', 'toy'\]"):
        run(tmp_path / "none", "nyt25")
    params["benchmarks"]["toy"]["train"] = {"stepz": 2}
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match=r"train \(with benchmarks.toy.train\) has unknown"):
        run(tmp_path / "bad", "toy")
    params["benchmarks"]["toy"]["train"] = {"steps": "many"}
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match=r"benchmarks.toy.train\).steps = 'many'"):
        run(tmp_path / "bad", "toy")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_model_fails_the_stage_with_one_line(inputs, tmp_path, monkeypatch, capsys,
                                                       workers):
    """One model's error ends the stage with one line naming it, forked or not; the other
    model (already running, or trained before it) is finished and kept."""
    from pipeline.errors import run_cli

    original = train.train_one

    def broken(job, shared, **kw):
        if job.method == "proto":
            raise PipelineError("no room for prototypes")
        return original(job, shared, **kw)

    monkeypatch.setattr(train, "train_one", broken)  # forked workers inherit it
    root, enc, splits, graph, features = inputs
    p = _params(root, enc, methods=["regrab", "proto"], workers=workers)
    argv = ["--splits", str(splits), "--graph", str(graph), "--features", str(features),
            "--relations", str(labels_of(graph)), "--out", str(tmp_path / "m"),
            "--params", str(p)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(train.main, argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "error: split_0/proto: no room for prototypes"
    assert (tmp_path / "m/split_0/regrab/model.safetensors").is_file()
    assert not (tmp_path / "m/split_0/regrab/state.safetensors").exists()  # finished
    assert not (tmp_path / "m/summary.json").exists()


def test_wrong_prior_episodes_corrupt_the_prior_rows_and_leave_the_labels(inputs, tmp_path,
                                                                          monkeypatch):
    """With train.wrong_prior_rate 1 every episode with shots reads other relations' priors
    (texts included), while its support, queries and query labels stay those of the episode."""
    from model.methods.regrab import RegrabHead
    from model.training import loop

    seen = []
    means, predictive = RegrabHead.prior_means, RegrabHead.log_predictive

    def spy_means(self, states, rows, text=None):
        if self.training:
            seen.append({"rows": rows.clone(), "text": None if text is None else text.clone()})
        return means(self, states, rows, text)

    def spy_predictive(self, support, query, h, generator=None):
        if self.training:
            seen[-1]["k"] = support.shape[2]
        return predictive(self, support, query, h, generator)

    episodes = []
    sample = loop.EpisodeSampler.sample

    def spy_sample(self, rng, n, k, q, b):
        ep = sample(self, rng, n, k, q, b)
        if b == 1:
            episodes.append(ep)
        return ep

    monkeypatch.setattr(RegrabHead, "prior_means", spy_means)
    monkeypatch.setattr(RegrabHead, "log_predictive", spy_predictive)
    monkeypatch.setattr(loop.EpisodeSampler, "sample", spy_sample)
    _run(inputs, tmp_path / "w", wrong_prior_rate=1.0, zero_shot_rate=0.0)
    checkpoint = read_checkpoint(tmp_path / "w/split_0/regrab/model.safetensors")
    assert checkpoint.params["train"]["wrong_prior_rate"] == 1.0
    train_rows = {0, 1, 2}  # the toy graph's rows of P1, P2, P3 (the training relations)
    assert len(episodes) == len(seen) == 4
    for ep, step in zip(episodes, seen, strict=True):
        assert step["k"] > 0
        true_rows = torch.as_tensor(ep.relation)  # sampler index = graph row for P1..P3
        got = step["rows"].cpu()
        assert not torch.any(got == true_rows)  # every way reads a wrong prior (or none)
        assert set(got[got >= 0].tolist()) <= train_rows
        blank = got < 0
        if step["text"] is not None:  # blank ways read no text; the others their row's
            assert torch.isnan(step["text"][blank]).all()
            assert not torch.isnan(step["text"][~blank]).any()
        # the support and the queries are the episode's own: sentences of its relations
        assert ep.support.shape[:2] == ep.query.shape[:2]
    # The model kept carries the held-out weights chosen on the validation relations.
    assert checkpoint.state["head.prior.mix"].shape == (2,)
