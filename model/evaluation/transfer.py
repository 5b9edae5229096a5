"""Score trained checkpoints on relations they were not trained on: the library behind
``regrab-score`` (a user's own file) and the ``transfer`` stage (SemEval and other sets).

Episodes are drawn from the data exactly as ``evaluate`` draws them from a test split, for
every method trained on every split of a benchmark's models folder plus the untrained
``floor`` on the same episodes. Relations with fewer than K + Q sentences are skipped; those a
checkpoint trained or validated on are excluded (or kept and flagged). Besides
:func:`pipeline.report.summarise`'s tables, the result says how many ways took their prior
from the graph, from the relation's name alone, or from the shared fallback
(:data:`model.prior.gcn.PRIOR_KINDS`), and each method's paired difference with the floor.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from model.encoder.frozen_cache import LowerCache
from model.episodes import Setting
from model.evaluation.config import EvalConfig, TransferSet
from model.evaluation.shots import UnequalSetting
from model.evaluation.shots import summarise as summarise_shots
from model.evaluation.split_episodes import SplitEpisodes
from model.evaluation.splits import FLOOR, evaluate_episodes, merge_shares, method_shares
from model.files.checkpoint import MODEL_FILE, model_file, read_checkpoint
from model.methods import registry
from pipeline import report
from pipeline.detection import summarise_uncertainty
from pipeline.errors import PipelineError
from pipeline.fewrel import load_relation_texts
from pipeline.workers import JobFiles, run_jobs, usable_workers

log = logging.getLogger(__name__)


def stored_models(models: Path, methods: Iterable[str]) -> dict[str, dict[str, Path]]:
    """``{split: {method: model.safetensors}}`` for every trained split under ``models``
    (empty when none is)."""
    methods = list(methods)
    found: dict[str, dict[str, Path]] = {}
    for split in sorted(p for p in models.glob("split_*") if p.is_dir()):
        for method in methods:
            path = model_file(split / method)
            if path.is_file():
                found.setdefault(split.name, {})[method] = path
    return found


def checkpoints(models: Path, methods: list[str]) -> dict[str, dict[str, Path]]:
    """:func:`stored_models`, refused when there is none."""
    found = stored_models(models, methods)
    if not found:
        raise PipelineError(f"no split_*/<method>/{MODEL_FILE} under {models}; train first "
                            "(dvc repro) or point --models at a benchmark's models folder")
    return found


def sort_relations(table: pa.Table, needed: int, trained: set[str],
                   keep_trained: bool,
                   listed: Iterable[str] = ()) -> tuple[pa.Table, dict[str, Any]]:
    """Drop relations with too few sentences and, unless kept, those a model trained on.

    ``listed`` names every relation of the file, so one with no usable sentence (``[]``)
    is counted among the skipped too.
    """
    grouped = table.group_by("relation").aggregate([("relation", "count")]).to_pydict()
    counts = {**dict.fromkeys(listed, 0),
              **dict(zip(grouped["relation"], grouped["relation_count"], strict=True))}
    small = {r: n for r, n in sorted(counts.items()) if n < needed}
    seen = sorted(set(counts) & trained)
    drop = set(small) | (set() if keep_trained else set(seen))
    kept = table.filter(pc.invert(pc.is_in(table["relation"], pa.array(sorted(drop),
                                                                        pa.string()))))
    return kept, {"too_few_sentences": small, "trained_on": seen,
                  "trained_on_excluded": not keep_trained,
                  "relations_scored": sorted(set(counts) - drop)}


def cut_relations(table: pa.Table, per_relation: int, seed: int) -> pa.Table:
    """At most ``per_relation`` sentences of each relation, a seeded random choice kept in
    file order (0 keeps everything): large relations then cost no more than small ones."""
    if per_relation <= 0:
        return table
    rng = np.random.default_rng(seed)
    rel = np.asarray(table.column("relation").to_pylist(), dtype=object)
    keep = []
    for r in dict.fromkeys(rel):
        rows = np.flatnonzero(rel == r)
        keep.append(rows if len(rows) <= per_relation else
                    np.sort(rng.choice(rows, per_relation, replace=False)))
    return table.take(pa.array(np.sort(np.concatenate(keep))))


def vs_floor(per_split: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """``<method>_minus_floor`` per setting: the mean paired difference in points, its t
    interval over splits (None with one split) and its normal interval over the paired
    episodes of every split (the same episodes for the method and the floor)."""
    out: dict[str, Any] = {}
    for split, methods in per_split.items():
        floor = methods.get(FLOOR, {})
        for method, settings in methods.items():
            if method == FLOOR:
                continue
            for s, c in settings.items():
                if s in floor:
                    d = (np.asarray(c["episodes"]) - np.asarray(floor[s]["episodes"])) * 100
                    out.setdefault(f"{method}_minus_floor", {}).setdefault(s, {})[split] = d
    result: dict[str, Any] = {}
    for key, settings in out.items():
        result[key] = {}
        for s, by_split in settings.items():
            means = [float(d.mean()) for d in by_split.values()]
            pooled = np.concatenate(list(by_split.values()))
            between = report.interval(means)
            result[key][s] = {
                "diff": float(np.mean(means)),
                "ci95": between["ci95"] if len(means) > 1 else None,
                "episode_ci95": report.normal_ci95(pooled),
                "per_split": dict(zip(by_split, means, strict=True))}
    return result


def score_table(name: str, table: pa.Table, models: Path, base: EvalConfig,
                settings: list[Setting], device: str, methods: list[str] | None = None,
                episodes: int | None = None, keep_trained: bool = False,
                listed: Iterable[str] = (), workers: int = 1,
                descriptions: Mapping[str, str | None] | None = None,
                nota: bool = False, unequal: bool = False, cluster: str | None = None,
                skip_unplayable: bool = False) -> dict[str, Any]:
    """Score every method trained on every split under ``models`` on ``table``.

    Args:
        name: the data's name, in messages.
        table: its sentences (``FEWSHOT_SCHEMA``).
        models: a benchmark's models folder.
        base: the ``evaluate`` section (queries, seed, batch sizes, read_names).
        settings: the settings to score.
        device: where to run the models.
        methods: the methods to score (None: every method trained on every split).
        episodes: episodes per setting and split (None: ``base.episodes``).
        keep_trained: keep (and flag) relations a checkpoint trained or validated on.
        listed: every relation of the file, so empty ones are counted as skipped.
        workers: processes scoring at once (CPU only), one split each, or shares of a
            split's methods when there are fewer splits; the numbers do not depend on it.
        descriptions: relation id -> description, read with the relation's name by priors
            with ``descriptions: true`` (None: names only).
        nota: also score none-of-the-above episodes (``base.nota_rates`` at those of
            ``base.nota_settings`` among ``settings``) and fit temperatures; the data has no
            validation relations, so thresholds, temperatures and best uncertainty scores are
            chosen on other episodes of the same relations.
        unequal: also score ``base.unequal_settings`` (:mod:`model.evaluation.shots`) whose
            ways the data has enough relations for.
        cluster: a Dask scheduler's address to score on (None: this machine).
        skip_unplayable: leave out (with a warning) the settings with more ways than the data
            has usable relations, instead of refusing; refused still when none is left. For a
            pipeline whose settings are shared by sets that lose relations to training (a
            team's own relations can take a transfer set's).

    Returns:
        ``summary`` (:func:`pipeline.report.summarise`, plus ``relations``, ``priors``,
        ``vs_floor``; ``skipped_settings``, setting -> why it was left out, when any was),
        ``methods``, ``cfg`` (the evaluate config used), ``sentences`` (kept) and ``needed``
        (the fewest sentences a scored relation has).
    """
    wanted = methods or list(registry.names())
    unknown = sorted(set(wanted) - set(registry.names()))
    if unknown:
        raise PipelineError(f"--methods has {unknown}; use some of {list(registry.names())}")
    found = checkpoints(models, wanted)
    everywhere = [m for m in wanted if all(m in paths for paths in found.values())]
    if methods and everywhere != methods:
        missing = sorted(set(methods) - set(everywhere))
        raise PipelineError(f"{missing} not trained on every split under {models}; "
                            "train them or leave them out of --methods")
    if not settings:
        raise PipelineError("--settings is empty; give e.g. 5w1s,5w5s")
    if episodes is not None and episodes < 1:
        raise PipelineError(f"--episodes {episodes}: give 1 or more")
    trained: set[str] = set()
    encoders: dict[str, list[str]] = {}
    for split, paths in found.items():
        for method, path in paths.items():
            checkpoint = read_checkpoint(path)
            for part in ("train", "val"):
                trained |= set((checkpoint.relations or {}).get(part, []))
            encoders.setdefault(checkpoint.config.encoder.name, []).append(f"{split}/{method}")
    if len(encoders) > 1:
        uses = "; ".join(f"{', '.join(m[:3])}{' ...' if len(m) > 3 else ''} use {e[:80]}"
                         for e, m in sorted(encoders.items()))
        raise PipelineError(f"the models under {models} use different encoders ({uses}); "
                            "score one benchmark's models at a time")
    if not everywhere:
        raise PipelineError(f"no method is trained on every split under {models}; give a "
                            "benchmark's models folder")
    cfg = dataclasses.replace(
        base, methods=tuple(everywhere), settings=tuple(s.name for s in settings), splits=(),
        episodes=episodes or base.episodes, floor=True,
        nota_rates=base.nota_rates if nota else (),
        nota_settings=tuple(s for s in base.nota_settings
                            if nota and s in {x.name for x in settings}),
        nota_episodes=episodes or base.episodes,
        temperature_episodes=base.temperature_episodes if nota else 0, noisy_setting="",
        unequal_settings=())
    unequal_settings = [UnequalSetting.parse(s) for s in base.unequal_settings] if unequal else []
    needed = max([s.shots for s in settings] + [u.high for u in unequal_settings]) + cfg.queries
    table, relations = sort_relations(table, needed, trained, keep_trained, listed)
    usable = len(relations["relations_scored"])
    cfg = dataclasses.replace(cfg, unequal_settings=tuple(
        u.name for u in unequal_settings if u.ways <= usable))
    too_many = [s.name for s in settings if s.ways > usable]
    skipped: dict[str, str] = {}
    if too_many and skip_unplayable and len(too_many) < len(settings):
        why = (f"{usable} usable relations (>= {needed} sentences"
               f"{'' if keep_trained else ', not trained on'})")
        skipped = {s: f"more ways than the {why}" for s in too_many}
        log.warning("%s: %s left out: the data has %s", name, ", ".join(too_many), why)
        settings = [s for s in settings if s.name not in skipped]
        cfg = dataclasses.replace(
            cfg, settings=tuple(s.name for s in settings),
            nota_settings=tuple(s for s in cfg.nota_settings if s not in skipped))
        too_many = []
    if too_many:
        raise PipelineError(
            f"{name} has {usable} usable relations (>= {needed} sentences"
            f"{'' if keep_trained else ', not trained on'}), fewer than the ways of "
            f"{too_many}; lower N in --settings" + ("" if keep_trained else
                                                    " or pass --keep-trained"))
    shares = [_Share(split, i, part) for i, split in enumerate(found)
              for part in method_shares(cfg, cfg.methods, len(found),
                                        usable_workers(workers, device))]
    workers = usable_workers(workers, device, len(shares))
    # One process shares one frozen-layer cache between splits (the same sentences); forked
    # workers each fill their own.
    score = functools.partial(_score_share, table=table, models=models, device=device,
                              cache=LowerCache() if workers == 1 else None,
                              descriptions=dict(descriptions or {}))
    results = run_jobs(score, shares, workers=workers, threads=cfg.threads, log=log,
                       cost=lambda share: len(share.cfg.methods),
                       describe=lambda share: f"{share.split}: "
                                              + (", ".join(share.cfg.methods) or FLOOR),
                       cluster=cluster, gpu=device != "cpu",
                       files=JobFiles(reads=lambda share: [models / share.split]))
    per_split, nota = merge_shares((share.split, cfg.methods, *result[:2])
                                   for share, result in zip(shares, results, strict=True))
    priors: dict[str, dict[str, int]] = {}
    for result in results:
        for method, counts in result[2].items():
            total = priors.setdefault(method, dict.fromkeys(counts, 0))
            for kind, n in counts.items():
                total[kind] += n
    summary = report.summarise(per_split, nota) | summarise_uncertainty(per_split, nota)
    summary["relations"] = relations
    summary["priors"] = priors
    summary["vs_floor"] = vs_floor(per_split)
    summary["shots"] = summarise_shots(per_split, cfg.unequal_settings)
    if skipped:  # only then, so a set that plays every setting reports as before
        summary["skipped_settings"] = skipped
    return {"summary": summary, "methods": everywhere, "cfg": cfg, "sentences": table.num_rows,
            "needed": needed}


@dataclasses.dataclass(frozen=True)
class _Share:
    """Some methods of one checkpoint split, scored in one process."""

    split: str
    index: int
    cfg: EvalConfig  # its methods, and whether it scores the floor


def _score_share(share: _Share, table: pa.Table, models: Path, device: str,
                 cache: LowerCache | None, descriptions: dict[str, str | None]
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The share's cells, NOTA cells and ways per prior kind of each method."""
    # The data is no model's split, so no model is checked against one.
    eps = SplitEpisodes(share.split, table, share.cfg, share.index,
                        val=table if share.cfg.needs_val else None)
    eps.descriptions = descriptions
    with torch.no_grad():
        cells, nota = evaluate_episodes(eps, models, share.cfg, device,
                                        cache if cache is not None else LowerCache())
    return cells, nota, eps.priors


def relation_texts(name: str, spec: TransferSet, table: pa.Table, seed: int
                   ) -> tuple[pa.Table, dict[str, str | None]]:
    """The set's table with the names of ``spec.relations`` (when given) and, with
    ``spec.shuffle``, every relation's id, name and description moved to another relation;
    and the descriptions to read, by relation id."""
    keys = sorted(set(table.column("relation").to_pylist()))
    texts: dict[str, tuple[str, str | None]] = {}
    if spec.relations is not None:
        path = Path(spec.relations)
        if not path.is_file():
            raise PipelineError(f"transfer set {name}: relations file {path} not found; add it "
                                "to fetch.files and run dvc repro fetch, or set relations: null")
        texts = load_relation_texts(path)
        missing = [k for k in keys if k not in texts]
        if missing:
            raise PipelineError(f"transfer set {name}: {path} names no text for {len(missing)} "
                                f"relation(s), e.g. {missing[0][:80]!r}; add them to the file")
    first: dict[str, str] = {}
    for r, n in zip(table.column("relation").to_pylist(),
                    table.column("relation_name").to_pylist(), strict=True):
        first.setdefault(r, n)
    names = {k: texts[k][0] if k in texts else first[k] for k in keys}
    said = {k: texts[k][1] if k in texts else None for k in keys}
    ids = {k: k for k in keys}
    if spec.shuffle:
        if len(keys) < 2:
            raise PipelineError(f"transfer set {name}: shuffle needs 2 or more relations")
        rng = np.random.default_rng([seed, 7])
        while True:  # a derangement: no relation keeps its own text
            order = rng.permutation(len(keys))
            if all(int(order[i]) != i for i in range(len(keys))):
                break
        ids = {k: keys[int(order[i])] for i, k in enumerate(keys)}
    rel = [ids[r] for r in table.column("relation").to_pylist()]
    table = table.set_column(table.schema.get_field_index("relation"),
                             table.schema.field("relation"), pa.array(rel, pa.string()))
    table = table.set_column(table.schema.get_field_index("relation_name"),
                             table.schema.field("relation_name"),
                             pa.array([names[r] for r in rel], pa.string()))
    return table, said
