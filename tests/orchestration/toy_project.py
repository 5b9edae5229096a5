"""The real REGRAB project at toy size, for the scheduled retrain's end-to-end test.

:func:`toy_files` cuts every raw input of ``params.yaml``'s ``fetch`` section down from the
data mirror (a few relations and sentences of each FewRel file, a few thousand Wikidata
triples written as a JSON dump); :func:`toy_params` is the project's ``params.yaml`` with
every stage shrunk through its own section and the ``fetch`` files pointing at a local
upstream (:mod:`tests.upstream`). The Wikidata dump follows the upstream's checksum list, so a
new dump is new work for ``check_sources``. :func:`wikidata_dump` writes the dump of a version.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import merged

ROOT = Path(__file__).resolve().parents[2]
#: The dump's path under data/raw and on the upstream (its checksum list: /sums/sha1sums).
DUMP = "wikidata/dumps/toy-latest-all.json.bz2"
TRIPLES = "wikidata/triples/toy-codex.tsv"
#: Relations and sentences per relation kept of each FewRel-format file.
SIZES = {"fewrel/val_nyt.json": (13, 12), "fewrel/val_wiki.json": (5, 12),
         "fewrel/train_wiki.json": (9, 12), "fewrel/val_semeval.json": (5, 10)}
#: Files served as the mirror has them (small already).
AS_IS = ("fewrel/pid2name.json", "fewrel/semeval_relations.json",
         "regrab_official/embeddings.pkl")


def cut_fewrel(path: Path, relations: int, per_relation: int) -> dict[str, list]:
    """The first ``relations`` relations (sorted keys) of a FewRel file, first sentences each."""
    data = json.loads(path.read_text())
    return {key: data[key][:per_relation] for key in sorted(data)[:relations]}


def read_triples(mirror: Path) -> list[tuple[str, str, str]]:
    lines = (mirror / "wikidata/triples/wd50k-train.csv").read_text().splitlines()
    return [tuple(line.split(",")) for line in lines if line.count(",") == 2]


def pick_triples(mirror: Path, relations: list[str], per_relation: int,
                 skip: int = 0) -> list[tuple[str, str, str]]:
    """Up to ``per_relation`` wd50k triples of each of ``relations``, after the first ``skip``."""
    seen: dict[str, int] = {}
    out = []
    for triple in read_triples(mirror):
        rel = triple[1]
        if rel in relations:
            seen[rel] = seen.get(rel, 0) + 1
            if skip < seen[rel] <= skip + per_relation:
                out.append(triple)
    return out


def frequent_relations(mirror: Path, count: int) -> list[str]:
    """wd50k's ``count`` most frequent relations, most frequent first."""
    freq: dict[str, int] = {}
    for _, rel, _ in read_triples(mirror):
        freq[rel] = freq.get(rel, 0) + 1
    return sorted(freq, key=lambda r: (-freq[r], r))[:count]


def wikidata_dump(triples: list[tuple[str, str, str]]) -> bytes:
    """A bz2 JSON dump (``[``, one item a line ending in ``,``, ``]``) holding ``triples``."""
    items: dict[str, dict[str, list]] = {}
    for head, rel, tail in triples:
        snak = {"snaktype": "value", "property": rel, "datavalue": {
            "type": "wikibase-entityid",
            "value": {"entity-type": "item", "id": tail, "numeric-id": int(tail[1:])}}}
        items.setdefault(head, {}).setdefault(rel, []).append(
            {"mainsnak": snak, "type": "statement", "rank": "normal"})
    lines = ["["] + [json.dumps({"type": "item", "id": q, "claims": claims}) + ","
                     for q, claims in items.items()] + ["]"]
    return bz2.compress(("\n".join(lines) + "\n").encode())


#: The relation the v2 dump adds: a FewRel test relation of the toy data (val_wiki's P206,
#: "located in or next to body of water"), in no triple of v1.
NEW_RELATION = "P206"


def toy_relations(mirror: Path) -> list[str]:
    """The relations of the toy FewRel files, sorted."""
    return sorted({key for path, (count, _) in SIZES.items() if "semeval" not in path
                   for key in sorted(json.loads((mirror / path).read_text()))[:count]})


def dump_versions(mirror: Path) -> tuple[bytes, bytes]:
    """The v1 and v2 dumps: v2 has more triples and one more relation (NEW_RELATION)."""
    base = [r for r in dict.fromkeys(toy_relations(mirror) + frequent_relations(mirror, 10))
            if r != NEW_RELATION]
    v1 = pick_triples(mirror, base, 100)
    v2 = v1 + pick_triples(mirror, base, 30, skip=100) + pick_triples(mirror, [NEW_RELATION],
                                                                      150)
    return wikidata_dump(v1), wikidata_dump(v2)


def toy_files(mirror: Path) -> dict[str, bytes]:
    """Every raw input at toy size, by its path under ``data/raw`` (the dump's v1)."""
    files = {path: json.dumps(cut_fewrel(mirror / path, *size)).encode()
             for path, size in SIZES.items()}
    files.update({path: (mirror / path).read_bytes() for path in AS_IS})
    codex = (mirror / "wikidata/triples/codex-m-valid.tsv").read_text().splitlines()
    kept = [line for line in codex if line.split("\t")[1:2] != [NEW_RELATION]]
    files[TRIPLES] = ("\n".join(kept[:300]) + "\n").encode()
    files[DUMP] = dump_versions(mirror)[0]
    return files


def own_folder(mirror: Path, seed: int = 0) -> dict[str, bytes]:
    """``data/own`` files whose labels are shuffled: five own relations of 16 sentences each,
    every sentence's label drawn at random among them.

    The sentences are of the toy FewRel test relations (val_wiki's, beyond the sentences the
    toy test file keeps), so training on them teaches the model to confuse exactly the
    relations the gate scores on: at toy size, a harm the paired table can see."""
    data = json.loads((mirror / "fewrel/val_wiki.json").read_text())
    count, kept = SIZES["fewrel/val_wiki.json"]
    sentences = [rec for key in sorted(data)[:count] for rec in data[key][kept:kept + 16]]
    keys = [f"own_{i}" for i in range(5)]
    labels = [keys[i % len(keys)] for i in range(len(sentences))]
    random.Random(seed).shuffle(labels)
    own: dict[str, list] = {}
    for label, rec in zip(labels, sentences, strict=True):
        own.setdefault(label, []).append(rec)
    names = {key: [f"own relation {i}", "labels shuffled"] for i, key in enumerate(keys)}
    return {"data/own/labelled.json": json.dumps(own).encode(),
            "data/own/relations.json": json.dumps(names).encode()}


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def fetch_section(base: str, files: dict[str, bytes]) -> dict[str, Any]:
    """``fetch`` reading ``files`` from the upstream at ``base``: the dump follows the
    upstream's sha1sums list, every other file is pinned to its sha256."""
    entries = {}
    for path, body in sorted(files.items()):
        key = Path(path).name.split(".")[0].replace("-", "_")
        follow = path == DUMP
        entries[key] = {"path": path, "url": f"{base}/{path}",
                        "sha256": None if follow else sha256(body),
                        "follow": f"{base}/sums/sha1sums" if follow else None}
    return {"retries": 1, "timeout_s": 20, "files": entries}


#: Every stage's section shrunk (merged into the project's params.yaml).
TOY = {
    # FewRel trains longer, with a larger encoder step: enough for shuffled own labels to hurt.
    "benchmarks": {"fewrel": {"train": {"steps": 30, "lr_encoder": 1.0e-3}}},
    "prepare_fewshot": {"datasets": ["val_nyt", "val_wiki", "train_wiki", "val_semeval"]},
    "split_nyt": {"seeds": [1], "train_relations": 5, "val_relations": 3,
                  "test_relations": 5, "min_instances": 10},
    "split_fewrel": {"heldout_relations": 3, "max_per_relation": 12},
    "train_transe": {"model": {"dim": 16, "epochs": 2, "batch_size": 512, "negatives": 8,
                               "chunk_size": 256}, "checkpoint_every": 1,
                     "heldout_fraction": 0.05},
    "build_graph": {"k": 3},
    "model": {"langevin": {"samples": 2, "steps": 2, "eval_samples": 0}},
    "train": {"methods": ["regrab", "proto"], "steps": 4, "ways": [3], "shots": [1],
              "queries": 2, "val_every": 4, "val_episodes": 4, "val_settings": ["3w1s"],
              "checkpoint_every": 4, "workers": 1, "dvclive": False},
    "comparison": {"methods": [], "episodes": 10},
    "evaluate": {"methods": ["regrab", "proto"], "settings": ["5w1s"], "episodes": 20,
                 "queries": 3, "floor": False, "batch_episodes": 20, "nota_rates": [],
                 "nota_settings": [], "nota_episodes": 10, "unequal_settings": [],
                 "unequal_episodes": 10, "temperature_episodes": 0, "noisy_setting": "",
                 "noisy_episodes": 10, "workers": 1},
    "evaluate_own": {"settings": ["2w1s"], "episodes": 10, "per_relation": 12},
    "transfer": {"settings": ["5w1s"], "episodes": 5, "per_relation": 10},
    "active_labelling": {"transfer_sets": [], "methods": {"regrab": ["random"]},
                         "ways": 3, "start": 1, "pool": 3, "queries": 2, "labels": 1,
                         "episodes": 2, "bar_labels": 1, "workers": 1},
    "promote": {"benchmarks": ["nyt25", "fewrel"], "settings": ["5w1s"], "episodes": 20,
                "headline_margin": 0.0, "setting_margin": 0.0},
}


def toy_params(base: str, files: dict[str, bytes]) -> str:
    """The project's params.yaml at toy size, fetching ``files`` from ``base``."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["transfer"]["sets"] = {"semeval": params["transfer"]["sets"]["semeval"]}
    params = merged(params, TOY)
    params["active_labelling"]["methods"] = TOY["active_labelling"]["methods"]  # not merged
    params["fetch"] = fetch_section(base, files)
    return yaml.safe_dump(params, sort_keys=False)
