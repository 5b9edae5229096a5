"""Predict relations of new sentences with a trained checkpoint, with posterior uncertainty.

:class:`Predictor` loads a checkpoint once, encodes a support set once
(:meth:`Predictor.set_support`) and then labels any number of query batches
(:meth:`Predictor.predict`). Each query gets the probability of every candidate relation
(REGRAB's Monte Carlo predictive over S posterior samples of the prototypes, exactly what
``evaluate`` scores) and every uncertainty score that applies to the method
(:func:`model.evaluation.uncertainty.uncertainty_scores`: the point scores such as
``max_prob`` and ``entropy`` for every head, ``mutual_information`` and the other posterior
scores for heads that sample, such as REGRAB's, and the ``_ts`` scores with the checkpoint's
validation temperature), larger when less sure; its records write each as what its name says
(``max_prob`` as ``top_prob``, the top probability). A query abstains ("none of these") by
the rule of :mod:`model.predict.abstain`: past a cutoff read from the checkpoint's validation
relations for the support's ways and shots, 5% of validation-like queries by default, or
below an explicit top-probability threshold.

Sentences are :class:`~model.predict.sentences.Sentence` objects or what
:func:`~model.predict.sentences.parse_sentence` reads (marked text, FewRel records, split columns).
Support with unequal K per relation is one episode, as ``evaluate`` scores its unequal-shot
settings: the support padded to the largest K with each way's count
(:func:`model.posterior.shots.head_logits`). A prototype is its own way's mean (proto, mtb,
proto_label, scored as ``prototype_scoring`` says), and REGRAB's ``gaussian`` posterior gives
each way the posterior of its own sentences; with ``predictive: gaussian`` its scores are the
posterior predictive, whose per-way variance keeps a way with more sentences from drawing the
queries (docs/model.md#unequal-shots). A head that needs equal K cannot mix zero-shot ways with
few-shot ones: maml, versa and bmaml average fits to the support cut to the smallest K
(:mod:`model.posterior.subsample`), the others (``softmax`` likelihoods, gnn, snail, pair) get
each way's sentences repeated up to the largest K.
Prototype samples depend on the support and the seed only, so a query's result does not
depend on which batch it comes in (beyond the encoder's float rounding of padded batches).

Shapes:
    S posterior samples, N ways (candidate relations), K shots, Q queries, D encoding size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from model.encoder.frozen_cache import encode_all
from model.evaluation.uncertainty import mc_log_probs, uncertainty_scores
from model.files.loader import load_model
from model.files.score_quantiles import ScoreQuantiles
from model.files.suspicion_cutoff import SuspicionCutoff
from model.methods.base import FewShotModel
from model.posterior.shots import head_logits, padded_support
from model.predict.abstain import AbstainRule, check_request, make_rule
from model.predict.predictions import Predictions
from model.predict.sentences import parse_sentence, sentences_table
from model.predict.summary import SupportSummary, unread_descriptions
from model.predict.support_check import SupportCheck, check_support
from model.prior.labels import relation_name
from pipeline.errors import PipelineError

#: Seeds are in ``[0, 2**63)``, which every generator here takes (torch's overflows at 2**64).
SEED_BOUND = 2**63


class NonFinite(PipelineError):
    """The model gave NaN or infinite probabilities for some queries.

    Attributes:
        queries, total: their positions in the batch, and the batch's size.
    """

    def __init__(self, queries: list[int], total: int, first: str | None = None) -> None:
        self.queries, self.total = queries, total
        first = first or f"query {queries[0]} of the batch"
        super().__init__(
            f"the model gave non-finite probabilities (NaN or inf) for {len(queries)} of "
            f"{total} queries (the first: {first}), so none of its predictions can be "
            "trusted; check the checkpoint's weights or retrain it")


class NonFiniteWeights(PipelineError):
    """A weight or buffer of the model is NaN or infinite."""


def refuse_non_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Stop when a weight or buffer (``model.state_dict()``, a checkpoint's state) is NaN
    or infinite.

    Such a model (a diverged training run, a damaged file) predicts NaN for every relation:
    the argmax is then the first relation and no threshold abstains, silently.

    Raises:
        NonFiniteWeights: naming the first such tensors.
    """
    bad = [name for name, t in tensors.items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteWeights(
            f"{len(bad)} weight tensors hold NaN or inf (first: {', '.join(bad[:3])}): the "
            "training diverged or the file is damaged; retrain it (e.g. with a lower learning "
            "rate) or use an earlier checkpoint")


@dataclass(frozen=True)
class SupportState:
    """A support set as :meth:`Predictor.set_support` left it: what :meth:`Predictor.predict`
    reads, so one predictor can answer several support sets in turn
    (:meth:`Predictor.support_state`, :meth:`Predictor.use_support`).

    Attributes:
        summary: what each candidate relation got (:class:`SupportSummary`).
        episode: the padded support (1, N, K, D), the prior means (1, N, D) or None, and each
            way's count (1, N).
        check: each support sentence's suspicion.
        encodings: (sum K, D) each support sentence's encoding, once.
    """

    summary: SupportSummary
    episode: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]
    check: SupportCheck
    encodings: torch.Tensor

    @property
    def nbytes(self) -> int:
        """The bytes its tensors hold (what a cache of support sets counts)."""
        sup, h, counts = self.episode
        return sum(t.numel() * t.element_size() for t in (sup, counts, self.encodings)
                   if t is not None) + (0 if h is None else h.numel() * h.element_size())


class Predictor:
    """A trained model ready to label sentences; load once, set the support, predict often.

    Args:
        model: a :class:`~model.methods.base.FewShotModel` (see :meth:`from_checkpoint`).
        seed: seeds the S posterior samples of the prototypes (same seed, same numbers).
        abstain_rate: share of validation-like queries to abstain on: a query abstains when
            its abstain score is above that quantile on the validation relations
            (:mod:`model.predict.abstain`); 0 never abstains. None: 5% when ``val_scores``
            are given, else never.
        abstain_score: the uncertainty score to abstain by (None: the one the checkpoint
            chose on validation relations).
        threshold: abstain when the top probability is below it instead (overrides the rate
            and the score).
        val_scores: the checkpoint's uncertainty on its validation relations
            (:attr:`~model.files.checkpoint.Checkpoint.val_scores`).
        support_noise: the checkpoint's suspicion cutoff, above which a support sentence is
            flagged as possibly mislabelled (None: scored, never flagged).
        batch_size: sentences per encoder batch.
    """

    def __init__(self, model: FewShotModel, seed: int = 0, threshold: float | None = None,
                 batch_size: int = 64, abstain_rate: float | None = None,
                 abstain_score: str | None = None,
                 val_scores: Sequence[ScoreQuantiles] | None = None,
                 support_noise: SuspicionCutoff | None = None) -> None:
        check_request(abstain_rate, abstain_score, threshold, val_scores or ())
        if not 0 <= seed < SEED_BOUND:
            raise PipelineError(f"seed {seed} is out of range; give one from 0 to "
                                f"{SEED_BOUND - 1}")
        if batch_size < 1:
            raise PipelineError(f"batch size {batch_size}: give 1 or more")
        refuse_non_finite(model.state_dict())
        self.model = model.eval()
        self.seed, self.batch_size = int(seed), int(batch_size)
        self.threshold = None if threshold is None else float(threshold)
        self.abstain_rate, self.abstain_score = abstain_rate, abstain_score
        self.val_scores = tuple(val_scores or ())
        self.device = next(model.parameters()).device
        self.summary: SupportSummary | None = None
        self.support_noise = support_noise
        #: Each support sentence's suspicion and the flagged ones (:meth:`set_support`).
        self.support_check: SupportCheck | None = None
        #: The support as one padded episode: (1, N, K, D), h (1, N, D) or None, counts (1, N).
        self._support: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None
        self.support_encodings: torch.Tensor | None = None  # (sum K, D), each sentence once

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], device: str = "cpu",
                        **kwargs: Any) -> Predictor:
        """Load ``path`` onto ``device``: a train-stage ``model.safetensors``, or a folder
        made by ``regrab-models export``."""
        try:
            model, checkpoint = load_model(path, device)
        except (RuntimeError, KeyError, TypeError) as exc:  # a payload that does not fit
            raise PipelineError(f"checkpoint {path} is corrupt ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:120]}); retrain it") from exc
        try:
            return cls(model, val_scores=checkpoint.val_scores,
                       support_noise=checkpoint.support_noise, **kwargs)
        except NonFiniteWeights as exc:
            raise PipelineError(f"checkpoint {path}: {exc}") from None

    @property
    def relations(self) -> list[str]:
        if self.summary is None:
            raise PipelineError("no support set; call set_support first")
        return self.summary.relations

    @torch.no_grad()
    def encode(self, sentences: Sequence[Any], progress: str | None = None) -> torch.Tensor:
        """Encodings of sentences (anything :func:`parse_sentence` reads); ``progress``: a bar.

        Shapes:
            -> (len(sentences), D)
        """
        parsed = [parse_sentence(s) for s in sentences]
        if not parsed:
            return torch.zeros(0, self.model.encoder.out_dim, device=self.device)
        tokens = self.model.encoder.tokenize(sentences_table(parsed))
        return encode_all(self.model.encoder, tokens, None, self.batch_size, progress)

    @torch.no_grad()
    def set_support(self, support: Mapping[str, Sequence[Any]],
                    zero_shot: Sequence[str] = (),
                    names: Mapping[str, str] | None = None,
                    descriptions: Mapping[str, str | None] | None = None,
                    progress: bool = False) -> SupportSummary:
        """Encode the support once: ``{relation: [sentence, ...]}`` plus zero-shot ids
        (``progress``: with a progress bar).

        A relation outside the checkpoint's graph gets a prior from its name: ``names[r]``
        when given, else one read from the key (``gene_found_in_organism``,
        ``Cause-Effect(e1,e2)``; a bare Wikidata id is no name), else the shared fallback.
        A checkpoint with ``model.prior.descriptions: true`` reads ``descriptions[r]`` after
        the name; the summary says what each prior read (``texts``) and notes descriptions
        that were not read, and why. A relation with no sentences (or listed in
        ``zero_shot``) is predicted from its prior alone, which needs a ``regrab`` checkpoint
        whose graph holds it or that can read its name.
        """
        if any(isinstance(s, str | Mapping) for s in support.values()):
            raise PipelineError("support maps each relation to a list of sentences")
        support = {str(r): list(s) for r, s in support.items()}
        for r in zero_shot:
            if support.get(r):
                raise PipelineError(f"relation {r} has support sentences and is also given "
                                    "as zero-shot; drop one of the two")
            support.setdefault(str(r), [])
        relations = list(support)
        if len(relations) < 2:
            raise PipelineError(f"need at least 2 candidate relations, got {len(relations)}; "
                                "add support sentences or zero-shot relation ids")
        model, head = self.model, self.model.head
        given = dict(names or {})
        said = {str(r): d for r, d in (descriptions or {}).items() if d and d.strip()}
        if model.prior is not None:
            model.prior.add_names({r: given.get(r) or relation_name(r) for r in relations},
                                  model.encoder, None, self.batch_size,
                                  descriptions={r: said.get(r) for r in relations})
        rows = model.rows(relations)  # (N,)
        shots = [len(support[r]) for r in relations]
        zs = [r for r, k in zip(relations, shots, strict=True) if k == 0]
        for r in zs:
            if model.prior is None:
                raise PipelineError(
                    f"relation {r} has no support sentences, and zero-shot needs the graph "
                    f"prior, which a {model.config.method} checkpoint lacks; give it support "
                    "sentences or use a regrab checkpoint")
            if rows[relations.index(r)] < 0:
                raise PipelineError(
                    f"relation {r} has no support sentences, is not in the checkpoint's "
                    f"relation graph ({len(model.prior.relations)} relations) and has no name "
                    "to read, so nothing predicts it; give it support sentences or a name")
        handling = self._plan(shots)
        enc = self.encode([s for r in relations for s in support[r]],
                          "encode support" if progress else None)  # (sum K, D)
        states = head.prior_states()
        h = head.prior_means(states, rows[None].to(self.device))  # (1, N, D) or None
        self.support_check = check_support(head, enc, shots, h, relations, self.support_noise)
        sup, counts = padded_support(enc, shots)  # (1, N, K, D), (1, N)
        self._support, self.support_encodings = (sup, h, counts), enc
        priors = {} if model.prior is None else {r: model.prior.prior_kind(r)
                                                  for r in relations}
        texts = {} if model.prior is None else {r: model.prior.text_kind(r) for r in relations}
        notes = unread_descriptions(model, relations, given, said, texts)
        self.summary = SupportSummary(relations, shots, shots, zs, priors, handling,
                                      notes=notes, texts=texts)
        self.abstain_rule()  # an abstain score this checkpoint lacks stops here
        return self.summary

    def support_state(self) -> SupportState:
        """The current support set, to come back to with :meth:`use_support`."""
        if self._support is None or self.summary is None or self.support_check is None \
                or self.support_encodings is None:
            raise PipelineError("no support set; call set_support first")
        return SupportState(self.summary, self._support, self.support_check,
                            self.support_encodings)

    def use_support(self, state: SupportState) -> None:
        """Predict against ``state`` (a support set this predictor encoded) from now on; the
        posterior samples are drawn afresh from it and the seed, so the answers are those
        :meth:`set_support` gave."""
        self.summary, self._support = state.summary, state.episode
        self.support_check, self.support_encodings = state.check, state.encodings

    def abstain_rule(self) -> AbstainRule:
        """Which queries of the current support abstain (:mod:`model.predict.abstain`): the
        stored validation settings read for its N ways and each way's K."""
        if self.summary is None:
            raise PipelineError("no support set; call set_support first")
        return make_rule(self.val_scores, len(self.summary.relations),
                         self.summary.used_shots, self.abstain_rate, self.abstain_score,
                         self.threshold, self.model.config.method)

    def _plan(self, shots: list[int]) -> str:
        """A sentence saying how unequal K is handled (every sentence is used)."""
        if len(set(shots)) == 1:
            return f"equal K={shots[0]}: one episode, as evaluate runs it"
        if getattr(self.model.head, "unequal_shots", False):
            return ("unequal K: one episode, each relation scored with its own sentences "
                    f"({self.fairness()})")
        method = self.model.config.method
        why = (f"{self.model.config.langevin.likelihood} likelihood"
               if method.startswith("regrab") else f"method {method}")
        if 0 in shots:
            raise PipelineError(
                f"this checkpoint's {why} needs equal K, so zero-shot relations cannot be "
                "mixed with few-shot ones; predict them in separate runs")
        if (members := getattr(self.model.head, "balanced_members", 0)) > 0:
            return (f"unequal K: the {why} needs equal K, so it averages {members} fits, each "
                    f"with every relation cut to K={min(shots)} of its sentences (in turn)")
        return (f"unequal K: the {why} needs equal K, so each relation's sentences are "
                f"repeated in order up to K={max(shots)} (oversampling); predictions may lean "
                "towards the relations with more sentences")

    def fairness(self) -> str:
        """How this checkpoint keeps relations with more sentences from drawing the queries."""
        cfg = self.model.config.langevin
        if self.model.config.method.startswith("regrab"):
            if cfg.predictive == "gaussian" and cfg.likelihood == "gaussian" \
                    and cfg.noise_eval and cfg.similarity == "euclidean":
                return "the posterior predictive widens a relation with fewer sentences"
            return ("predictive: samples, so predictions lean towards the relations with more "
                    "sentences")
        if cfg.prototype_scoring == "unbiased" and cfg.similarity == "euclidean":
            return "distances less each prototype's sampling noise"
        if cfg.prototype_scoring == "normalised":
            return "prototypes at their encodings' length"
        return "plain means: predictions lean towards the relations with more sentences"

    @torch.no_grad()
    def sample_logits(self, query: torch.Tensor) -> torch.Tensor:
        """Per-sample logits of encoded queries against the support's prototypes.

        The generator is seeded afresh on every call, so the prototype samples, which do not
        depend on the queries, are the same for every batch.

        Shapes:
            query: (Q, D) -> (S, Q, N)
        """
        if self._support is None:
            raise PipelineError("no support set; call set_support first")
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        sup, h, shots = self._support
        return head_logits(self.model.head, sup, query[None], h, gen, shots)[0]

    def predict(self, queries: Sequence[Any]) -> Predictions:
        """Probabilities, uncertainty scores and abstention for each query sentence."""
        relations, rule = self.relations, self.abstain_rule()
        logits = self.sample_logits(self.encode(queries)).double()  # (S, Q, N)
        log_p = mc_log_probs(logits)  # (Q, N)
        probs = log_p.exp()
        scores = uncertainty_scores(logits, rule.temperature, log_p)
        finite = torch.isfinite(probs).all(-1)
        for v in scores.values():
            finite &= torch.isfinite(v)
        if not bool(finite.all()):
            bad = (~finite).nonzero().flatten().tolist()
            raise NonFinite(bad, len(finite))
        return Predictions(relations, probs.cpu().numpy(),
                           {k: v.cpu().numpy() for k, v in scores.items()}, rule)
