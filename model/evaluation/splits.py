"""Few-shot, zero-shot and none-of-the-above accuracy and calibration of trained models on a
split: the library behind the ``evaluate`` stage and ``regrab-score``.

Each model encodes every test (and, for NOTA, validation) sentence once; episodes are then
assembled from the cached encodings (exact: the encoder sees one sentence at a time).
Episodes are seeded per split and setting, so every method sees the same episodes, and the
comparison with REGRAB is paired. Zero-shot settings (``{N}w0s``) are run for ``regrab``
only (prototypes = prior means).

Per method and setting it measures accuracy and the calibration of the predictive
probabilities (REGRAB: the average over its S posterior samples; proto and mtb: their
softmax): ECE in equal-width bins of the max probability, a reliability diagram, and
accuracy against coverage when abstaining on the least confident queries (with its AURC).
:mod:`pipeline.report` turns the per-split cells into means over splits.

NOTA (FewRel 2.0): a fraction r of the queries comes from test relations outside the N ways
and a method answers "none of the above" by abstaining below a confidence threshold. The
threshold is chosen per split, method, setting and rate on NOTA episodes of the split's
validation relations (never on test), with ``min(N, validation relations - 1)`` ways, as the
one that maximises NOTA accuracy there. Test NOTA episodes are the setting's plain test
episodes with outside queries in place of some inside ones (:mod:`model.evaluation.nota`).

A model is scored only on the split it was trained on: its stored digests of the split's
train and val files must match the split's files.

An untrained ``floor`` row can be added (``evaluate.floor``): see :mod:`model.methods.floor`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import Episodes, EpisodeSampler, Setting
from model.evaluation.calibration import fit_temperature, tempered
from model.evaluation.config import EvalConfig
from model.evaluation.nota import NotaEpisodes, sample_nota
from model.evaluation.scoring import (
    OUTSIDE,
    EpisodeScores,
    aurc,
    best_threshold,
    expected_calibration_error,
    flat_queries,
    nota_correct,
    reliability_bins,
    score_episodes,
    scores_from_log_probs,
    selective_accuracy,
)
from model.files.checkpoint import load_model, model_file
from model.methods import registry
from model.methods.floor import CosinePrototypeHead, floor_encoder
from model.prior.gcn import PRIOR_KINDS, GraphPrior, relation_name
from pipeline import report
from pipeline.errors import PipelineError
from pipeline.io import file_digest, read_fewshot

FLOOR = "floor"


def nota_key(setting: str, rate: float) -> str:
    """Metric key of a NOTA cell: ``5w1s_r15`` for rate 0.15 (no dot inside a DVC key)."""
    return f"{setting}_r{round(rate * 100):d}"


def check_trained_on(payload: dict[str, Any], split_dir: Path, digests: dict[str, Any],
                     path: Path, test_relations: list[str]) -> None:
    """Refuse a model whose stored split digests are not those of ``split_dir``, or whose
    training or validation relations are among the split's test relations (a test file
    from another split: the digests cover the train and val files only)."""
    inputs = (payload.get("params") or {}).get("inputs") or {}
    for part, digest in digests.items():
        if part not in inputs:
            raise PipelineError(f"{path} records no digest of its {part}.parquet, so it cannot "
                                f"be checked against {split_dir}; retrain it (dvc repro train)")
        if inputs[part] != digest:
            raise PipelineError(
                f"{path} was trained on another split than {split_dir} (its {part}.parquet "
                f"differs); retrain it on {split_dir.name} (dvc repro train) or pass the "
                "--splits and --models folders that belong together")
    seen = payload.get("relations") or {}
    overlap = sorted(set(test_relations) & {str(r) for part in ("train", "val")
                                            for r in seen.get(part) or ()})
    if overlap:
        raise PipelineError(
            f"{split_dir / 'test.parquet'} holds relations {overlap} that {path} was trained "
            f"or validated on, so it is not {split_dir.name}'s test file; rebuild the splits "
            "(dvc repro) or pass the --splits folder the models were trained on")


def cell(scores: EpisodeScores, bins: int) -> dict[str, Any]:
    """Per-split numbers of one method and setting (see :func:`pipeline.report.summarise`)."""
    conf, hit = scores.confidence, scores.correct
    return {"episodes": scores.accuracy(), "ece": expected_calibration_error(conf, hit, bins),
            "aurc": aurc(conf, hit), "curve": selective_accuracy(conf, hit, report.COVERAGES),
            "bins": reliability_bins(conf, hit, bins)}


def _generator(device: Any, *key: int) -> torch.Generator:
    # Seeded per split and setting: sampling heads repeat, and every method sees the same
    # noise stream (the episodes themselves are shared anyway).
    seed = int(np.random.SeedSequence(list(key)).generate_state(1)[0])
    return torch.Generator(device=device).manual_seed(seed)


class SplitEpisodes:
    """Every episode of one split: plain test episodes, and NOTA ones on test and validation.

    NOTA test episodes are the plain test episodes of their setting with outside queries in
    place of some inside ones, so one draw of posterior samples per episode (they depend on
    the support only) scores both, and NOTA numbers are paired with the plain ones.
    """

    def __init__(self, split: str, test: pa.Table, cfg: EvalConfig, split_index: int,
                 val: pa.Table | None = None) -> None:
        """Sample every episode of the split named ``split`` from its ``test`` (and ``val``).

        Args:
            split: the split's name (its folder's): where its models are, and in messages.
            test: the split's test sentences (``FEWSHOT_SCHEMA``).
            cfg: the ``evaluate`` section.
            split_index: the split's number, part of every episode seed.
            val: the split's validation sentences; needed when ``cfg.nota``.
        """
        self.name, self.cfg, self.index = split, cfg, split_index
        self.n_test = test.num_rows
        self.test = EpisodeSampler(test.column("relation").to_pylist(), f"{split} test split")
        #: Settings that need a model: the reported ones, then NOTA-only ones.
        self.settings = [Setting.parse(n) for n in dict.fromkeys(
            [*cfg.settings, *(cfg.nota_settings if cfg.nota else ())])]
        self.plain = {}
        for s in self.settings:
            rng = np.random.default_rng([cfg.seed, split_index, self.key(s.name)])
            self.plain[s.name] = self.test.sample(rng, s.ways, s.shots, cfg.queries, cfg.episodes)
        self.table, self.val = test, None
        #: Per method with a prior: how many ways of the reported settings' episodes took
        #: their prior from the graph, a name alone or the fallback (filled when scored).
        self.priors: dict[str, dict[str, int]] = {}
        self.nota_test: dict[str, list[NotaEpisodes]] = {}
        self.nota_val: dict[str, list[NotaEpisodes]] = {}
        #: Validation episodes per reported setting, to fit a temperature on.
        self.calib: dict[str, Episodes] = {}
        if val is None:
            if cfg.nota:
                raise PipelineError(f"{split} has no validation sentences to choose NOTA "
                                    "thresholds on; set evaluate.nota_rates to []")
            return
        self.val = EpisodeSampler(val.column("relation").to_pylist(),
                                  f"{split} validation split")
        self.table = pa.concat_tables([test, val])  # val rows follow the test rows
        if cfg.temperature_episodes > 0 and len(self.val.relations) >= 2:
            for name in cfg.settings:
                s = Setting.parse(name)
                if s.shots == 0:
                    continue
                rng = np.random.default_rng([cfg.seed, split_index, 3000 + self.key(name)])
                self.calib[name] = self.val.sample(
                    rng, min(s.ways, len(self.val.relations)), s.shots, cfg.queries,
                    cfg.temperature_episodes)
        if not cfg.nota:
            return
        for i, name in enumerate(cfg.nota_settings):
            s = Setting.parse(name)
            val_ways = min(s.ways, len(self.val.relations) - 1)
            base = self.val.sample(np.random.default_rng([cfg.seed, split_index, 2000 + i]),
                                   val_ways, s.shots, cfg.queries, cfg.nota_episodes)
            self.nota_test[name] = [
                sample_nota(self.test, np.random.default_rng([cfg.seed, split_index, 1000 + i,
                                                              j]), self.plain[name], rate)
                for j, rate in enumerate(cfg.nota_rates)]
            self.nota_val[name] = [
                sample_nota(self.val, np.random.default_rng([cfg.seed, split_index, 2000 + i, j]),
                            base, rate) for j, rate in enumerate(cfg.nota_rates)]

    @classmethod
    def read(cls, split_dir: Path, cfg: EvalConfig, split_index: int) -> SplitEpisodes:
        """The episodes of the split folder ``split_dir`` (its ``test.parquet``, and
        ``val.parquet`` when ``cfg.nota``)."""
        test = read_fewshot(split_dir / "test.parquet")
        has_val = (split_dir / "val.parquet").is_file()
        if cfg.nota and not has_val:
            raise PipelineError(f"{split_dir} has no val.parquet to choose NOTA thresholds on; "
                                "rerun the split stage or set evaluate.nota_rates to []")
        val = read_fewshot(split_dir / "val.parquet") if cfg.needs_val and has_val else None
        return cls(split_dir.name, test, cfg, split_index, val)

    def first(self, n: int) -> SplitEpisodes:
        """The same split with every episode set cut to its first ``n`` episodes (plain,
        NOTA and temperature ones): a method scored on them is paired with the others on
        the same episodes."""
        if n >= self.cfg.episodes:
            return self
        out = copy.copy(self)
        out.plain = {k: _first(e, n) for k, e in self.plain.items()}
        out.nota_test = {k: [_first(e, n) for e in v] for k, v in self.nota_test.items()}
        out.nota_val = {k: [_first(e, n) for e in v] for k, v in self.nota_val.items()}
        out.calib = {k: _first(e, n) for k, e in self.calib.items()}
        return out

    def names(self) -> dict[str, str | None]:
        """The name of each relation of the split, read from its ``relation_name``."""
        cols = self.table.select(["relation", "relation_name"]).to_pydict()
        return {r: relation_name(n or "") for r, n in zip(cols["relation"],
                                                          cols["relation_name"], strict=True)}

    def prior_ways(self, prior: GraphPrior) -> dict[str, int]:
        """Ways of the reported settings' test episodes per prior kind (:data:`PRIOR_KINDS`)."""
        kinds = np.array([PRIOR_KINDS.index(prior.prior_kind(r)) for r in self.test.relations])
        counts = sum(np.bincount(kinds[self.plain[n].relation].ravel(),
                                 minlength=len(PRIOR_KINDS)) for n in self.cfg.settings)
        return {k: int(c) for k, c in zip(PRIOR_KINDS, counts, strict=True)}

    def key(self, name: str) -> int:
        """Seed key of a setting: its index in ``settings``, NOTA-only ones from 1000."""
        if name in self.cfg.settings:
            return self.cfg.settings.index(name)
        return 1000 + self.cfg.nota_settings.index(name)

    def score(self, head: torch.nn.Module, enc: torch.Tensor,
              rows_of: Callable[[list[str]], torch.Tensor], settings: list[str],
              bins: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Cells of ``settings`` and the NOTA cells among them, for one head.

        Args:
            head: the method's head, in eval mode.
            enc: encodings of :attr:`table` (test rows, then validation rows).
            rows_of: relation ids -> graph rows (``FewShotModel.rows``).
            settings: setting names to score.
            bins: calibration bins.
        """
        cfg, cells, nota = self.cfg, {}, {}
        test_enc, test_rows = enc[: self.n_test], rows_of(self.test.relations)
        for name in settings:
            ep, extra = self.plain[name], self.nota_test.get(name, [])
            query, label = flat_queries(ep.query)
            width = query.shape[1]
            # The seeded generator is consumed by the support's samples only, so plain scores
            # do not change when NOTA queries ride along.
            log_p, _ = score_episodes(
                head, test_enc, ep.relation, ep.support,
                np.concatenate([query, *(e.query for e in extra)], 1),
                np.concatenate([label, *(e.label for e in extra)], 1), test_rows,
                cfg.batch_episodes, _generator(enc.device, cfg.seed, self.index, self.key(name)))
            if name in cfg.settings:
                cells[name] = cell(scores_from_log_probs(log_p[:, :width], label), bins)
                if name in self.calib:
                    cells[name].update(self._tempered(head, enc, rows_of, name,
                                                      log_p[:, :width], label, bins))
            if not extra:
                continue
            val_eps = self.nota_val[name]
            i = cfg.nota_settings.index(name)
            val_log_p, _ = score_episodes(
                head, enc[self.n_test:], val_eps[0].relation, val_eps[0].support,
                np.concatenate([e.query for e in val_eps], 1),
                np.concatenate([e.label for e in val_eps], 1), rows_of(self.val.relations),
                cfg.batch_episodes, _generator(enc.device, cfg.seed, self.index, 2000 + i))
            for j, rate in enumerate(cfg.nota_rates):
                m, mv = extra[j].query.shape[1], val_eps[j].query.shape[1]  # fewer val ways
                val_scores = scores_from_log_probs(val_log_p[:, j * mv:(j + 1) * mv],
                                                   val_eps[j].label)
                threshold = best_threshold(val_scores)
                start = width + j * m
                test_scores = scores_from_log_probs(log_p[:, start:start + m], extra[j].label)
                nota[nota_key(name, rate)] = {
                    "acc": float(nota_correct(test_scores, threshold).mean() * 100),
                    "threshold": threshold,
                    "abstained": float((test_scores.confidence < threshold).mean()),
                    "outside": float((extra[j].label == OUTSIDE).mean()),
                    "val_ways": int(val_eps[j].relation.shape[1])}
        return cells, nota


    def _tempered(self, head: torch.nn.Module, enc: torch.Tensor,
                  rows_of: Callable[[list[str]], torch.Tensor], name: str, log_p: np.ndarray,
                  label: np.ndarray, bins: int) -> dict[str, float]:
        """The temperature fitted on this setting's validation episodes, and the test ECE
        after scaling by it (accuracy is unchanged)."""
        ep = self.calib[name]
        query, val_label = flat_queries(ep.query)
        val_log_p, _ = score_episodes(
            head, enc[self.n_test:], ep.relation, ep.support, query, val_label,
            rows_of(self.val.relations), self.cfg.batch_episodes,
            _generator(enc.device, self.cfg.seed, self.index, 3000 + self.key(name)))
        tau = fit_temperature(torch.from_numpy(np.asarray(val_log_p)), val_label)
        scaled = tempered(torch.from_numpy(np.asarray(log_p)), tau).numpy()
        ts = scores_from_log_probs(scaled, label)
        return {"ece_ts": expected_calibration_error(ts.confidence, ts.correct, bins),
                "temperature": tau}


def scoring_workers(workers: int, device: Any) -> int:
    """Processes that may score at once: ``workers`` on the CPU, one on CUDA (it does not
    survive a fork)."""
    return workers if str(device) == "cpu" else 1


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


def _first(episodes: Any, n: int) -> Any:
    """The first ``n`` episodes of an :class:`Episodes` or :class:`NotaEpisodes`."""
    return dataclasses.replace(episodes, **{f.name: getattr(episodes, f.name)[:n]
                                            for f in dataclasses.fields(episodes)})


def _no_graph(relations: list[str]) -> torch.Tensor:
    return torch.full((len(relations),), -1)


def evaluate_split(split_dir: Path, models_dir: Path, cfg: EvalConfig, device: str,
                   cache: LowerCache, split_index: int, capped: Mapping[str, int] | None = None,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells and NOTA cells of the split folder ``split_dir`` (see :func:`evaluate_episodes`).

    A model is scored only if it was trained on this split (:func:`check_trained_on`).
    """
    eps = SplitEpisodes.read(split_dir, cfg, split_index)
    digests = {part: file_digest(split_dir / f"{part}.parquet") for part in ("train", "val")}

    def check(payload: dict[str, Any], path: Path) -> None:
        check_trained_on(payload, split_dir, digests, path, eps.test.relations)

    return evaluate_episodes(eps, models_dir, cfg, device, cache, check, capped)


def evaluate_episodes(
    eps: SplitEpisodes, models_dir: Path, cfg: EvalConfig, device: str, cache: LowerCache,
    check: Callable[[dict[str, Any], Path], None] | None = None,
    capped: Mapping[str, int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells ``{method: {setting: cell}}`` and NOTA cells ``{method: {key: cell}}`` of a split.

    Args:
        eps: the split's episodes; its models are ``<models_dir>/<eps.name>/<method>``.
        models_dir: the benchmark's models folder.
        cfg: the ``evaluate`` section.
        device: where to run the models.
        cache: encodings of the frozen layers, shared between models and splits.
        check: called with each model's payload and path before it is used; raises to refuse
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
            model, payload = load_model(path, device)
            if check is not None:
                check(payload, path)
            model.eval()
            encoder_cfg = model.encoder.config
            key = (encoder_cfg.name, encoder_cfg.markers, encoder_cfg.max_length)
            if key not in tokens:
                tokens[key] = model.encoder.tokenize(eps.table)
            if model.prior is not None:
                if cfg.read_names:
                    model.prior.add_names(eps.names(), model.encoder, None, cfg.encode_batch)
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
