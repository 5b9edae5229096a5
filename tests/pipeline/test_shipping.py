"""A job's files to a worker and back: paths moved into the scratch folder, writes and
removals carried back, each file renamed into place whole."""

from __future__ import annotations

from pathlib import Path

from pipeline.shipping import (
    Digests,
    JobFiles,
    apply,
    collect,
    dumps,
    loads,
    pack,
    relocated,
    returned,
    unpack,
)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_paths_related_to_a_shipped_path_move_others_stay(tmp_path):
    models, encoder = tmp_path / "models", tmp_path / "encoders" / "bert"
    scratch = tmp_path / "scratch"
    roots = [str(models / "split_0")]

    def fn(split: str) -> tuple[Path, Path]:
        return models / split, encoder  # a closure over two paths

    job = {"out": models / "split_0" / "proto", "relative": Path("x.txt")}
    moved = loads(dumps(job), scratch, roots)
    assert moved["out"] == relocated(scratch, str(models / "split_0" / "proto"))
    assert moved["relative"] == Path("x.txt")  # no shipped path: left as the stage wrote it
    # The folder above a shipped one moves too, so ``models / split`` is the shipped copy.
    there, kept = loads(dumps(fn), scratch, roots)("split_0")
    assert there == relocated(scratch, roots[0]) and kept == encoder
    assert loads(dumps(job)) == job  # without a scratch folder nothing moves


def test_a_relative_path_is_shipped_by_its_absolute_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    parcel, sources = pack(Path("data"), JobFiles(reads=lambda job: [job]), Digests())
    assert list(parcel.files) == [str(tmp_path / "data" / "a.txt")]
    scratch = tmp_path / "scratch"
    job = unpack(parcel, {d: p.read_bytes() for d, p in sources.items()}, scratch)
    assert job == relocated(scratch, str(tmp_path / "data"))
    assert (job / "a.txt").read_text() == "a"


def test_writes_and_removals_come_back_and_unchanged_files_do_not(tmp_path):
    src = tmp_path / "stage"
    (src / "split").mkdir(parents=True)
    (src / "split" / "train.parquet").write_bytes(b"rows")
    out = src / "models" / "proto"
    out.mkdir(parents=True)
    (out / "state.safetensors").write_bytes(b"half-trained")
    (out / "kept.json").write_bytes(b"{}")
    files = JobFiles(reads=lambda job: [job[0]], writes=lambda job: [job[1]])
    digests = Digests()
    parcel, sources = pack((src / "split", out), files, digests)
    assert len(sources) == 3 and len(parcel.files) == 3
    scratch = tmp_path / "worker" / "job"
    split, folder = unpack(parcel, {d: p.read_bytes() for d, p in sources.items()}, scratch)

    # The job, on the worker: reads its split, finishes its model, removes its state.
    assert (split / "train.parquet").read_bytes() == b"rows"
    assert (folder / "state.safetensors").read_bytes() == b"half-trained"
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "dvclive" / "plots").mkdir(parents=True)
    (folder / "dvclive" / "plots" / "loss.tsv").write_bytes(b"step\tloss\n")
    (folder / "state.safetensors").unlink()
    (split / "train.parquet").write_bytes(b"changed")  # not a written folder: not sent back

    written = collect(parcel, scratch)
    assert sorted(written.files) == [str(out / "dvclive/plots/loss.tsv"),
                                     str(out / "model.safetensors")]  # kept.json unchanged
    assert written.removed == (str(out / "state.safetensors"),)
    apply(written)
    assert _tree(src) == {"split/train.parquet": b"rows", "models/proto/kept.json": b"{}",
                          "models/proto/model.safetensors": b"weights",
                          "models/proto/dvclive/plots/loss.tsv": b"step\tloss\n"}
    assert not list(out.glob(".*tmp"))  # renamed into place, no temporary left


def test_a_file_many_jobs_read_is_digested_once(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"same")
    digests = Digests()
    files = JobFiles(reads=lambda job: [tmp_path / "a"])
    first = pack(1, files, digests)[0].files
    opened = []
    monkeypatch.setattr(Path, "open", lambda *a, **k: opened.append(a) or None)
    assert pack(2, files, digests)[0].files == first and opened == []


def test_paths_in_a_result_name_the_stage_s_files_again(tmp_path):
    scratch = tmp_path / "scratch"
    value = {"model": relocated(scratch, "/work/models/m.safetensors"), "other": Path("/etc")}
    assert returned(dumps(value), str(scratch)) == {
        "model": Path("/work/models/m.safetensors"), "other": Path("/etc")}
