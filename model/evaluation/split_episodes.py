"""Every episode of one split, drawn once, and the scoring of one head on them.

Episodes are seeded per split and setting, so every method sees the same episodes and the
comparison with REGRAB is paired. NOTA test episodes are the plain test episodes of their
setting with outside queries in place of some inside ones (:mod:`model.evaluation.nota`);
NOTA thresholds are chosen on validation episodes, and a temperature
(:mod:`model.evaluation.calibration`) is fitted on validation episodes too.
:mod:`model.evaluation.splits` loads the models and hands each head to
:meth:`SplitEpisodes.score`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

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
from model.evaluation.shots import UnequalSetting, sample_unequal, step_share
from model.evaluation.support_noise import (
    NoisyEpisodes,
    detection_of_wrong,
    noisy_name,
    plant_wrong,
    suspicion_batches,
)
from model.evaluation.uncertainty import (
    POINT_SCORES,
    SCORES,
    TEMPERED_SCORES,
    detection,
    roc_points,
    select_scores,
)
from model.prior.gcn import GraphPrior
from model.prior.labels import PRIOR_KINDS, TEXT_KINDS, relation_name
from pipeline import report
from pipeline.errors import PipelineError
from pipeline.io import read_fewshot


def nota_key(setting: str, rate: float) -> str:
    """Metric key of a NOTA cell: ``5w1s_r15`` for rate 0.15 (no dot inside a DVC key)."""
    return f"{setting}_r{round(rate * 100):d}"


def cell(scores: EpisodeScores, bins: int) -> dict[str, Any]:
    """Per-split numbers of one method and setting (see :func:`pipeline.report.summarise`)."""
    conf, hit = scores.confidence, scores.correct
    return {"episodes": scores.accuracy(), "ece": expected_calibration_error(conf, hit, bins),
            "aurc": aurc(conf, hit), "curve": selective_accuracy(conf, hit, report.COVERAGES),
            "bins": reliability_bins(conf, hit, bins)}


def selective_cells(scores: dict[str, np.ndarray], correct: np.ndarray) -> dict[str, Any]:
    """Per uncertainty score: AURC (%) and accuracy (%) on the 80% of queries it is surest of."""
    return {k: {"aurc": aurc(-v, correct),
                "acc80": float(selective_accuracy(-v, correct, np.array([0.8]))[0])}
            for k, v in scores.items()}


def detection_cell(test: dict[str, np.ndarray], outside: np.ndarray,
                   val: dict[str, np.ndarray], val_outside: np.ndarray) -> dict[str, Any]:
    """Out-of-set detection by every score on test, and the scores chosen on validation.

    ``best`` is the score with the highest validation AUROC among all the head's scores,
    ``best_point`` among those a point estimate has too (raw and tempered probabilities);
    ``roc`` is the test ROC curve of ``best`` (:func:`model.evaluation.uncertainty.roc_points`).
    """
    det = {k: detection(v, outside) for k, v in test.items()}
    val_auroc = {k: detection(v, val_outside)["auroc"] for k, v in val.items()}

    def chosen(names: tuple[str, ...]) -> str:
        pool = [k for k in names if k in val_auroc and not np.isnan(val_auroc[k])]
        return max(pool, key=lambda k: val_auroc[k]) if pool else "max_prob"

    best = chosen(SCORES)
    return {"detection": det, "best": best,
            "best_point": chosen((*POINT_SCORES, *TEMPERED_SCORES)),
            "roc": roc_points(test[best], outside).tolist()}


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
            val: the split's validation sentences; needed when ``cfg.nota``. ``test`` itself
                for data without validation relations (a transfer set): NOTA thresholds,
                temperatures and best scores are then chosen on other episodes of the same
                relations (other seeds), never on the scored ones.
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
        #: The noisy setting's episodes: the plain ones with a mislabelled support sentence.
        self.noisy: dict[str, NoisyEpisodes] = {} if cfg.noisy is None else {
            cfg.noisy: plant_wrong(
                self.test, _first(self.plain[cfg.noisy], cfg.noisy_episodes),
                np.random.default_rng([cfg.seed, split_index, 4000 + self.key(cfg.noisy)]))}
        #: Further test episode sets by name, scored for accuracy and calibration only
        #: (:meth:`score_extra`): the unequal-shot ones (:mod:`model.evaluation.shots`).
        self.extra: dict[str, Episodes] = {}
        for i, name in enumerate(cfg.unequal_settings):
            self.extra.update(sample_unequal(
                self.test, UnequalSetting.parse(name), [cfg.seed, split_index, 6000 + i],
                cfg.queries, cfg.unequal_episodes))
        self.table, self.val = test, None
        #: Descriptions of relations outside a model's graph, read with their names by a prior
        #: with ``descriptions: true`` (a user's relations file; empty: names only).
        self.descriptions: dict[str, str | None] = {}
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
        shared = val is test
        what = "episodes for choices" if shared else "validation split"
        self.val = EpisodeSampler(val.column("relation").to_pylist(), f"{split} {what}")
        #: First row of the validation sentences in :attr:`table` (0: they are the test ones).
        self.val_start = 0 if shared else self.n_test
        # Validation rows follow the test rows (unless they are the same sentences).
        self.table = test if shared else pa.concat_tables([test, val])
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
        out.noisy = {k: _first(e, n) for k, e in self.noisy.items()}
        out.extra = {k: _first(e, n) for k, e in self.extra.items()}
        return out

    def names(self) -> dict[str, str | None]:
        """The name of each relation of the split, read from its ``relation_name``."""
        cols = self.table.select(["relation", "relation_name"]).to_pydict()
        return {r: relation_name(n or "") for r, n in zip(cols["relation"],
                                                          cols["relation_name"], strict=True)}

    def prior_ways(self, prior: GraphPrior) -> dict[str, int]:
        """Ways of the reported settings' test episodes per prior kind (:data:`PRIOR_KINDS`) and
        per what the prior read of the relation's text (:data:`TEXT_KINDS`)."""
        kinds = np.array([PRIOR_KINDS.index(prior.prior_kind(r)) for r in self.test.relations])
        counts = sum(np.bincount(kinds[self.plain[n].relation].ravel(),
                                 minlength=len(PRIOR_KINDS)) for n in self.cfg.settings)
        out = {k: int(c) for k, c in zip(PRIOR_KINDS, counts, strict=True)}
        read = np.array([TEXT_KINDS.index(prior.text_kind(r)) for r in self.test.relations])
        counts = sum(np.bincount(read[self.plain[n].relation].ravel(),
                                 minlength=len(TEXT_KINDS)) for n in self.cfg.settings)
        return out | {k: int(c) for k, c in zip(TEXT_KINDS, counts, strict=True)}

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
            log_p, scores = score_episodes(
                head, test_enc, ep.relation, ep.support,
                np.concatenate([query, *(e.query for e in extra)], 1),
                np.concatenate([label, *(e.label for e in extra)], 1), test_rows,
                cfg.batch_episodes, _generator(enc.device, cfg.seed, self.index, self.key(name)))
            tau = None
            if name in cfg.settings:
                plain = scores_from_log_probs(log_p[:, :width], label)
                cells[name] = cell(plain, bins)
                if name in self.calib:
                    cells[name].update(self._tempered(head, enc, rows_of, name,
                                                      log_p[:, :width], label, bins))
                    tau = cells[name]["temperature"]
                cells[name]["uncertainty"] = selective_cells(
                    select_scores(scores.uncertainty, slice(0, width), tau, log_p), plain.correct)
            if not extra:
                continue
            val_eps = self.nota_val[name]
            i = cfg.nota_settings.index(name)
            val_log_p, val_all = score_episodes(
                head, enc[self.val_start:], val_eps[0].relation, val_eps[0].support,
                np.concatenate([e.query for e in val_eps], 1),
                np.concatenate([e.label for e in val_eps], 1), rows_of(self.val.relations),
                cfg.batch_episodes, _generator(enc.device, cfg.seed, self.index, 2000 + i))
            for j, rate in enumerate(cfg.nota_rates):
                m, mv = extra[j].query.shape[1], val_eps[j].query.shape[1]  # fewer val ways
                val_cols = slice(j * mv, (j + 1) * mv)
                val_scores = scores_from_log_probs(val_log_p[:, val_cols], val_eps[j].label)
                threshold = best_threshold(val_scores)
                cols = slice(width + j * m, width + (j + 1) * m)
                test_scores = scores_from_log_probs(log_p[:, cols], extra[j].label)
                nota[nota_key(name, rate)] = {
                    "acc": float(nota_correct(test_scores, threshold).mean() * 100),
                    "threshold": threshold,
                    "abstained": float((test_scores.confidence < threshold).mean()),
                    "outside": float((extra[j].label == OUTSIDE).mean()),
                    "val_ways": int(val_eps[j].relation.shape[1]),
                    **detection_cell(
                        select_scores(scores.uncertainty, cols, tau, log_p),
                        extra[j].label == OUTSIDE,
                        select_scores(val_all.uncertainty, val_cols, tau, val_log_p),
                        val_eps[j].label == OUTSIDE)}
        for name in settings:
            if name in self.noisy:
                cells[noisy_name(name)] = self._noisy(head, test_enc, test_rows, name, bins)
        return cells | self.score_extra(head, test_enc, test_rows, bins), nota

    def score_extra(self, head: torch.nn.Module, enc: torch.Tensor, rows: torch.Tensor,
                    bins: int) -> dict[str, Any]:
        """Cells of the further episode sets (:attr:`extra`) a head can score: those with a
        shot per way (a step set's cell also has its per-episode ``share``).

        Args:
            head: the method's head, in eval mode.
            enc: encodings of the test sentences.
            rows: graph rows of the test relations.
            bins: calibration bins.
        """
        cells = {}
        for i, (name, ep) in enumerate(self.extra.items()):
            query, label = flat_queries(ep.query)
            _, scores = score_episodes(
                head, enc, ep.relation, ep.support, query, label, rows, self.cfg.batch_episodes,
                _generator(enc.device, self.cfg.seed, self.index, 5000 + i), ep.shots)
            cells[name] = cell(scores, bins)
            if ep.shots is not None and name.endswith("_step"):
                cells[name]["share"] = step_share(scores.prediction, ep.shots)
        return cells

    def _noisy(self, head: torch.nn.Module, enc: torch.Tensor, rows: torch.Tensor, name: str,
               bins: int) -> dict[str, Any]:
        """The cell of ``name``'s episodes with a mislabelled support sentence, and how well
        the head's suspicion of each support sentence finds it (``support_noise``)."""
        ep, cfg = self.noisy[name], self.cfg
        query, label = flat_queries(ep.query)
        log_p, _ = score_episodes(
            head, enc, ep.relation, ep.support, query, label, rows, cfg.batch_episodes,
            _generator(enc.device, cfg.seed, self.index, self.key(name)))  # the clean one's
        out = cell(scores_from_log_probs(log_p, label), bins)
        found = suspicion_batches(head, enc, ep.relation, ep.support, rows, cfg.batch_episodes)
        out["support_noise"] = detection_of_wrong(found, ep.wrong)
        return out

    def _tempered(self, head: torch.nn.Module, enc: torch.Tensor,
                  rows_of: Callable[[list[str]], torch.Tensor], name: str, log_p: np.ndarray,
                  label: np.ndarray, bins: int) -> dict[str, float]:
        """The temperature fitted on this setting's validation episodes, and the test ECE
        after scaling by it (accuracy is unchanged)."""
        ep = self.calib[name]
        query, val_label = flat_queries(ep.query)
        val_log_p, _ = score_episodes(
            head, enc[self.val_start:], ep.relation, ep.support, query, val_label,
            rows_of(self.val.relations), self.cfg.batch_episodes,
            _generator(enc.device, self.cfg.seed, self.index, 3000 + self.key(name)))
        tau = fit_temperature(torch.from_numpy(np.asarray(val_log_p)), val_label)
        scaled = tempered(torch.from_numpy(np.asarray(log_p)), tau).numpy()
        ts = scores_from_log_probs(scaled, label)
        return {"ece_ts": expected_calibration_error(ts.confidence, ts.correct, bins),
                "temperature": tau}


def _first(episodes: Any, n: int) -> Any:
    """The first ``n`` episodes of an :class:`Episodes` or :class:`NotaEpisodes`."""
    return dataclasses.replace(episodes, **{f.name: getattr(episodes, f.name)[:n]
                                            for f in dataclasses.fields(episodes)
                                            if getattr(episodes, f.name) is not None})
