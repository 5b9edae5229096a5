"""Few-shot, zero-shot and none-of-the-above accuracy and calibration of trained models on a
split: the library behind the ``evaluate`` stage and ``regrab-score``.

Each model encodes every test (and, for NOTA, validation) sentence once; its head is then
scored on the split's episodes (:class:`model.evaluation.split_episodes.SplitEpisodes`),
assembled from the cached encodings (exact: the encoder sees one sentence at a time).
Zero-shot settings (``{N}w0s``) are run for methods with a prior only (prototypes = prior
means).

Per method and setting it measures accuracy and the calibration of the predictive
probabilities (REGRAB: the average over its S posterior samples; proto and mtb: their
softmax): ECE in equal-width bins of the max probability, a reliability diagram, and
accuracy against coverage when abstaining on the least confident queries (with its AURC).
:mod:`pipeline.report` turns the per-split cells into means over splits.

NOTA (FewRel 2.0): a fraction r of the queries comes from test relations outside the N ways
and a method answers "none of the above" by abstaining below a confidence threshold. The
threshold is chosen per split, method, setting and rate on NOTA episodes of the split's
validation relations (never on test), with ``min(N, validation relations - 1)`` ways, as the
one that maximises NOTA accuracy there.

A model is scored only on the split it was trained on: its stored digests of the split's
train and val files must match the split's files. A stage scores a split in one job, or in
several that share its methods out (:func:`method_shares`, :func:`merge_shares`).

An untrained ``floor`` row can be added (``evaluate.floor``): see :mod:`model.methods.floor`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import Setting
from model.evaluation.config import EvalConfig
from model.evaluation.split_episodes import SplitEpisodes
from model.files.checkpoint import Checkpoint, model_file
from model.files.loader import load_model
from model.methods import registry
from model.methods.floor import CosinePrototypeHead, floor_encoder
from pipeline.errors import PipelineError
from pipeline.io import file_digest

FLOOR = "floor"


def split_digests(split_dir: Path) -> dict[str, str | None]:
    """The digests of ``split_dir``'s train and val files, as a checkpoint records them."""
    return {part: file_digest(split_dir / f"{part}.parquet") for part in ("train", "val")}


def check_trained_on(checkpoint: Checkpoint, split_dir: Path, digests: dict[str, Any],
                     path: Path, test_relations: list[str]) -> None:
    """Refuse a model whose stored split digests are not those of ``split_dir``, or whose
    training or validation relations are among the split's test relations (a test file
    from another split: the digests cover the train and val files only)."""
    inputs = (checkpoint.params or {}).get("inputs") or {}
    for part, digest in digests.items():
        if part not in inputs:
            raise PipelineError(f"{path} records no digest of its {part}.parquet, so it cannot "
                                f"be checked against {split_dir}; retrain it (dvc repro train)")
        if inputs[part] != digest:
            raise PipelineError(
                f"{path} was trained on another split than {split_dir} (its {part}.parquet "
                f"differs); retrain it on {split_dir.name} (dvc repro train) or pass the "
                "--splits and --models folders that belong together")
    seen = checkpoint.relations or {}
    overlap = sorted(set(test_relations) & {str(r) for part in ("train", "val")
                                            for r in seen.get(part) or ()})
    if overlap:
        raise PipelineError(
            f"{split_dir / 'test.parquet'} holds relations {overlap} that {path} was trained "
            f"or validated on, so it is not {split_dir.name}'s test file; rebuild the splits "
            "(dvc repro) or pass the --splits folder the models were trained on")


def method_shares(cfg: EvalConfig, methods: tuple[str, ...], splits: int,
                  workers: int) -> list[EvalConfig]:
    """One split's ``methods`` as the configs of the jobs that score them.

    One job when there are at least as many splits as workers (the splits keep every worker
    busy); otherwise the methods are dealt round-robin into one job per worker, and the first
    also scores the floor.
    """
    parts = max(1, min(len(methods), workers)) if splits < workers else 1
    return [dataclasses.replace(cfg, methods=methods[p::parts], floor=cfg.floor and p == 0)
            for p in range(parts)]


def merge_shares(parts: Iterable[tuple[str, tuple[str, ...], dict[str, Any], dict[str, Any]]]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells and NOTA cells per split from the jobs of :func:`method_shares`.

    Each part is ``(split, methods, cells, nota)``, ``methods`` all of the split's methods in
    their params order; the merged cells keep that order, the floor last, whichever job
    scored them.
    """
    cells: dict[str, dict[str, Any]] = {}
    notas: dict[str, dict[str, Any]] = {}
    order: dict[str, tuple[str, ...]] = {}
    for split, methods, part_cells, part_nota in parts:
        cells.setdefault(split, {}).update(part_cells)
        notas.setdefault(split, {}).update(part_nota)
        order[split] = (*methods, FLOOR)
    per_split = {s: {m: c[m] for m in order[s] if m in c} for s, c in cells.items()}
    nota = {s: {m: c[m] for m in order[s] if m in c} for s, c in notas.items()}
    return per_split, nota


def _no_graph(relations: list[str]) -> torch.Tensor:
    return torch.full((len(relations),), -1)


def evaluate_split(split_dir: Path, models_dir: Path, cfg: EvalConfig, device: str,
                   cache: LowerCache, split_index: int, capped: Mapping[str, int] | None = None,
                   descriptions: Mapping[str, str | None] | None = None,
                   other_training: bool = False,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells and NOTA cells of the split folder ``split_dir`` (see :func:`evaluate_episodes`).

    A model is scored only if it was trained on this split (:func:`check_trained_on`); with
    ``other_training``, only if none of its training or validation relations is among the
    split's test relations (a model trained before the training data changed, such as the
    promoted one a retrain is compared with). ``descriptions`` (relation id -> description)
    are read, with their names, for relations outside a model's graph by priors with
    ``descriptions: true``.
    """
    eps = SplitEpisodes.read(split_dir, cfg, split_index)
    eps.descriptions = dict(descriptions or {})
    digests = {} if other_training else split_digests(split_dir)

    def check(checkpoint: Checkpoint, path: Path) -> None:
        check_trained_on(checkpoint, split_dir, digests, path, eps.test.relations)

    return evaluate_episodes(eps, models_dir, cfg, device, cache, check, capped)


def evaluate_episodes(
    eps: SplitEpisodes, models_dir: Path, cfg: EvalConfig, device: str, cache: LowerCache,
    check: Callable[[Checkpoint, Path], None] | None = None,
    capped: Mapping[str, int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells ``{method: {setting: cell}}`` and NOTA cells ``{method: {key: cell}}`` of a split.

    Args:
        eps: the split's episodes; its models are ``<models_dir>/<eps.name>/<method>``.
        models_dir: the benchmark's models folder.
        cfg: the ``evaluate`` section.
        device: where to run the models.
        cache: encodings of the frozen layers, shared between models and splits.
        check: called with each model's checkpoint and path before it is used; raises to refuse
            it (``regrab-score`` scores data that is not the models' own split: none).
        capped: methods scored on the first episodes only (:meth:`SplitEpisodes.first`), with
            how many.
    """
    cells: dict[str, dict[str, Any]] = {}
    nota: dict[str, dict[str, Any]] = {}
    tokens: dict[tuple, Any] = {}
    encoder_cfg = None
    for method in cfg.methods:
        cells[method], nota[method] = {}, {}
        by_path: dict[Path, list[str]] = {}
        for s in eps.settings:
            # The paper's protocol keeps one model per setting ({method}/{setting}/); the
            # default keeps one model per method for every setting.
            path = model_file(models_dir / eps.name / method / s.name)
            if not path.exists():
                path = model_file(models_dir / eps.name / method)
            if not path.exists():
                if s.shots == 0 and not registry.get(method).zero_shot:
                    continue
                raise PipelineError(
                    f"{path} is missing; train {method} on {eps.name} (dvc repro train) "
                    "or drop it from evaluate.methods"
                )
            by_path.setdefault(path, []).append(s.name)
        for path, names in by_path.items():  # one model in memory at a time
            model, checkpoint = load_model(path, device)
            if check is not None:
                check(checkpoint, path)
            model.eval()
            encoder_cfg = model.encoder.config
            key = (encoder_cfg.name, encoder_cfg.markers, encoder_cfg.max_length)
            if key not in tokens:
                tokens[key] = model.encoder.tokenize(eps.table)
            if model.prior is not None:
                if cfg.read_names:
                    model.prior.add_names(eps.names(), model.encoder, None, cfg.encode_batch,
                                          eps.descriptions)
                model.prior.coverage(eps.test.relations, f"{eps.name} test")
                if eps.val is not None:
                    model.prior.coverage(eps.val.relations, f"{eps.name} validation")
                eps.priors[method] = eps.prior_ways(model.prior)
            enc = encode_all(model.encoder, tokens[key], cache, cfg.encode_batch)
            names = [n for n in names if Setting.parse(n).shots > 0 or model.prior is not None]
            own = eps.first(capped[method]) if capped and method in capped else eps
            c, n = own.score(model.head, enc, model.rows, names, cfg.calibration_bins)
            cells[method].update(c)
            nota[method].update(n)
    if cfg.floor:
        floor = floor_encoder(encoder_cfg, device)
        key = (encoder_cfg.name, encoder_cfg.markers, encoder_cfg.max_length)
        tok = tokens.get(key) or floor.tokenize(eps.table)
        enc = encode_all(floor, tok, cache, cfg.encode_batch)
        cells[FLOOR], nota[FLOOR] = eps.score(
            CosinePrototypeHead(1.0).eval(), enc, _no_graph,
            [s.name for s in eps.settings if s.shots > 0], cfg.calibration_bins)
    return cells, nota
