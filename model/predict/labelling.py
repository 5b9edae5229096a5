"""The ``active_labelling`` stage's jobs: the episodes a simulated user labels, and each
split's checkpoints labelling them.

:func:`plan` draws, for every split of the benchmark with models and every transfer set, the
pool episodes of one set (:func:`draw`, seeded by the set and split, so every method and
strategy labels on the same episodes); :func:`fill_cache` encodes the frozen layers of every
sentence once; :func:`label_set` runs :func:`model.predict.simulation.simulate` for each
method's checkpoint of a split. ``stages.active_labelling`` reads the params, runs the jobs
and writes the report (:mod:`pipeline.labelling_report`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import EpisodeSampler
from model.evaluation.config import TransferParams
from model.evaluation.splits import check_trained_on, split_digests
from model.evaluation.transfer import cut_relations, relation_texts, sort_relations
from model.files.checkpoint import model_file, read_checkpoint
from model.files.loader import load_model
from model.predict.config import ActiveLabellingParams
from model.predict.simulation import PoolEpisodes, sample_pool_episodes, simulate
from model.prior.labels import relation_name
from pipeline.config import load_benchmarks, load_section
from pipeline.errors import PipelineError
from pipeline.fewrel import load_relation_descriptions
from pipeline.io import read_fewshot


@dataclass(frozen=True)
class LabellingSet:
    """One set's sentences on one split (only those its episodes use) and its episodes."""

    name: str
    table: pa.Table  # FEWSHOT_SCHEMA rows; the episodes' rows index into it
    relations: list[str]  # the sampler's relations (``episodes.relation`` indexes them)
    episodes: PoolEpisodes
    descriptions: dict[str, str | None]
    #: For the benchmark's own test relations: the split folder models are checked against,
    #: and its train and val files' digests, taken here (a worker may not see the folder).
    split_dir: Path | None = None
    split_digests: dict[str, str | None] | None = None


@dataclass(frozen=True)
class Job:
    """One set labelled with the checkpoints of one split, in one process."""

    split: str
    models: Path  # <models>/<benchmark>/<split>
    set: LabellingSet


def seed_of(*key: object) -> int:
    """A seed from a key of numbers and names (a name counts by its CRC32)."""
    parts = [zlib.crc32(str(k).encode()) if not isinstance(k, int) else k for k in key]
    return int(np.random.SeedSequence(parts).generate_state(1)[0])


def draw(name: str, table: pa.Table, params: ActiveLabellingParams, split: str,
         what: str, descriptions: dict[str, str | None],
         split_dir: Path | None = None) -> LabellingSet:
    """The episodes of one set on one split, and the sentences they use."""
    needed = params.start + params.pool + params.queries
    sampler = EpisodeSampler(table.column("relation").to_pylist(), what)
    small = [(r, len(m)) for r, m in zip(sampler.relations, sampler.members, strict=True)
             if len(m) < needed]
    if small:
        raise PipelineError(f"{what}: relation {small[0][0]} has {small[0][1]} sentences, fewer "
                            f"than active_labelling start + pool + queries = {needed}; lower "
                            "them")
    if params.ways > len(sampler.relations):
        raise PipelineError(f"{what} has {len(sampler.relations)} relations, fewer than "
                            f"active_labelling.ways {params.ways}; lower it")
    rng = np.random.default_rng(seed_of(params.seed, name, split))
    eps = sample_pool_episodes(sampler, rng, params.ways, params.start, params.pool,
                               params.queries, params.episodes)
    rows = eps.rows
    digests = None if split_dir is None else split_digests(split_dir)
    return LabellingSet(name, table.take(pa.array(rows)), sampler.relations,
                        eps.remapped(rows), descriptions, split_dir, digests)


def names_of(table: pa.Table) -> dict[str, str | None]:
    """Each relation's name read from its ``relation_name`` (as ``evaluate`` reads it)."""
    cols = table.select(["relation", "relation_name"]).to_pydict()
    return {r: relation_name(n or "") for r, n in zip(cols["relation"], cols["relation_name"],
                                                      strict=True)}


def encoder_key(model: Any) -> tuple:
    c = model.encoder.config
    return (c.name, c.markers, c.max_length)


def label_set(job: Job, params: ActiveLabellingParams, device: str, cache: LowerCache,
                tokens: dict[tuple, Any]) -> dict[str, np.ndarray]:
    """``{method: accuracy (T, B, A)}`` of one split's checkpoints on one set."""
    out: dict[str, np.ndarray] = {}
    s = job.set
    for method, strategies in params.methods.items():
        path = model_file(job.models / method)
        if not path.is_file():
            raise PipelineError(f"{path} is missing; train {method} on {job.split} (dvc repro "
                                "train) or drop it from active_labelling.methods")
        model, checkpoint = load_model(path, device)
        model.eval()
        if s.split_dir is not None and s.split_digests is not None:
            check_trained_on(checkpoint, s.split_dir, s.split_digests, path, s.relations)
        if model.prior is not None:
            model.prior.add_names(names_of(s.table), model.encoder, None, params.encode_batch,
                                  s.descriptions)
        tok = tokens.get((encoder_key(model), job.split, s.name))
        if tok is None:  # an encoder other than the one that filled the cache
            tok = model.encoder.tokenize(s.table)
        enc = encode_all(model.encoder, tok, cache, params.encode_batch)
        rows = model.rows(s.relations).to(device)[torch.from_numpy(s.episodes.relation)
                                                   .to(device)]  # (B, N)
        h = model.head.prior_means(model.head.prior_states(), rows)
        out[method] = simulate(
            model.head, enc, h, s.episodes, strategies, params.labels * params.ways,
            seed_of(params.seed, s.name, job.split, method),
            torch.Generator().manual_seed(seed_of(params.seed, s.name, job.split, "random")),
            what=f"{method} ({path})", fix=f"drop it from active_labelling.methods.{method}")
    return out


def plan(args: Any, params: ActiveLabellingParams) -> tuple[list[Job], dict[str, str]]:
    """The jobs (one per set and split with models) and each set's title.

    Args:
        args: the stage's arguments: ``params`` (the params file), ``models`` (the folder of
            the benchmarks' models folders) and ``relations`` (FewRel's ``pid2name.json`` of
            the benchmark's test relations, or None).
        params: the ``active_labelling`` section.
    """
    benchmarks = load_benchmarks(args.params)
    if params.benchmark not in benchmarks:
        raise PipelineError(f"active_labelling.benchmark {params.benchmark!r} is not in "
                            f"benchmarks ({', '.join(benchmarks)}); fix the name")
    bench = benchmarks[params.benchmark]
    splits_dir, models = Path(bench.splits), args.models / params.benchmark
    if not splits_dir.is_dir():
        raise PipelineError(f"{splits_dir} is not a folder; run the split stage first")
    names = sorted(p.name for p in splits_dir.glob("split_*") if (models / p.name).is_dir())
    if not names:
        raise PipelineError(f"no split in {splits_dir} has models in {models}; train first "
                            "(dvc repro train)")
    transfer = load_section(TransferParams, "transfer", args.params) \
        if params.transfer_sets else None
    titles = {params.benchmark: bench.title}
    tables: dict[str, tuple[pa.Table, dict[str, str | None]]] = {}
    # Relations a checkpoint trained or validated on are left out of the transfer sets.
    trained = {r for split in names for m in params.methods if params.transfer_sets
               and model_file(models / split / m).is_file()
               for part in ("train", "val")
               for r in (read_checkpoint(model_file(models / split / m)).relations or {})
               .get(part, [])}
    for name in params.transfer_sets:
        spec = transfer.sets.get(name) if transfer else None
        if spec is None:
            raise PipelineError(f"active_labelling.transfer_sets names {name!r}, not in "
                                f"transfer.sets; fix the name")
        if spec.benchmarks and params.benchmark not in spec.benchmarks:
            raise PipelineError(f"transfer set {name} is for {list(spec.benchmarks)}'s "
                                f"checkpoints only; drop it from active_labelling.transfer_sets")
        if not Path(spec.data).is_file():
            raise PipelineError(f"transfer set {name}: {spec.data} not found; run dvc repro "
                                "prepare_fewshot")
        table = cut_relations(read_fewshot(spec.data), transfer.per_relation, transfer.seed)
        table, said = relation_texts(name, spec, table, transfer.seed)
        needed = params.start + params.pool + params.queries
        table, kept = sort_relations(table, needed, trained, False)
        if len(kept["relations_scored"]) < params.ways:
            raise PipelineError(
                f"transfer set {name} has {len(kept['relations_scored'])} relations with at "
                f"least start + pool + queries = {needed} sentences (and not trained on), "
                f"fewer than active_labelling.ways {params.ways}; lower the pool or queries")
        tables[name] = (table, said)
        titles[name] = spec.title
    said = load_relation_descriptions(args.relations)
    jobs = []
    for split in names:
        test = read_fewshot(splits_dir / split / "test.parquet")
        jobs.append(Job(split, models / split, draw(params.benchmark, test, params, split,
                                                    f"{split} test split", said,
                                                    splits_dir / split)))
        jobs += [Job(split, models / split, draw(name, table, params, split,
                                                 f"transfer set {name}", texts))
                 for name, (table, texts) in tables.items()]
    return jobs, titles


def fill_cache(jobs: list[Job], params: ActiveLabellingParams, device: str
               ) -> tuple[LowerCache, dict[tuple, Any]]:
    """The frozen layers' outputs of every sentence of every job, computed once here (the
    checkpoints share them) so that every worker reads the same numbers."""
    cache: LowerCache = LowerCache()
    first = next((model_file(jobs[0].models / m) for m in params.methods
                  if model_file(jobs[0].models / m).is_file()), None)
    if first is None:
        return cache, {}
    model, _ = load_model(first, device)
    key, tokens = encoder_key(model), {}
    for job in jobs:
        tok = model.encoder.tokenize(job.set.table)
        tokens[key, job.split, job.set.name] = tok
        if model.encoder.split > 0:
            cache.states(model.encoder, tok, np.arange(job.set.table.num_rows),
                         params.encode_batch, progress=True)
    return cache, tokens
