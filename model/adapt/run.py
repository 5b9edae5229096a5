"""Adapt a trained model's encoder to unlabelled sentences within a time budget.

:func:`adapt` takes a loaded model and the domain's sentences and changes the encoder's
stored top layer by one of :data:`~model.adapt.objectives.OBJECTIVES`; the head (prior,
posterior) is kept as it is. :func:`plan` times the work on this machine first: the frozen
lower layers run once per sentence (cached), then each training step runs the top layer
twice on a batch. A budget that cannot hold the cache and one step is refused before any
weight changes; otherwise the steps are cut to fit, and the loop stops at the budget.

:func:`adapted_checkpoint` is the source checkpoint with the new weights and an
``adaptation`` record in its summary (objective, the sentences' digest, steps, budget,
losses; for ``pseudo`` the relations' digest and what was kept), which the model card
prints. The caller writes it (atomically).

Shapes (letters as in :mod:`model`):
    B sentences of a batch, D sentence encoding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from model.adapt.objectives import (
    OBJECTIVES,
    TRAINED,
    anchor_penalty,
    fold_moments,
    info_nce,
    masked_copy,
    pooled_moments,
)
from model.adapt.pseudo import (
    PseudoTarget,
    RelationTexts,
    check_relations,
    pseudo_labels,
    relations_digest,
)
from model.encoder.frozen_cache import LowerCache, encode_rows
from model.encoder.tokens import TokenizedSet
from model.files.checkpoint import Checkpoint
from model.methods.base import FewShotModel
from model.predict.sentences import Sentence, sentences_table
from pipeline.errors import PipelineError

#: The objective ``regrab-adapt`` uses unless told otherwise: the best measured on SemEval,
#: though not by a margin its interval clears (docs/results/domain-adaptation.md).
DEFAULT_OBJECTIVE = "masked"
#: The learning rate of an objective when none is given: each the best measured on SemEval
#: (docs/results/domain-adaptation.md); 1e-4 for the others.
DEFAULT_LR = {"pseudo": 3e-5}
#: Sentences timed to estimate the frozen layers' cost per sentence.
TIMED_SENTENCES = 64


@dataclass(frozen=True)
class AdaptOptions:
    """How to adapt (the flags of ``regrab-adapt``).

    Attributes:
        objective: one of :data:`~model.adapt.objectives.OBJECTIVES`.
        minutes: the wall-clock budget on this machine, estimate and loop included.
        steps: the most training steps (``contrastive``; cut to fit ``minutes``).
        batch_size: sentences per step (the contrastive negatives are the batch's others).
        lr: AdamW learning rate of the top layer (None: the objective's, :data:`DEFAULT_LR`).
        temperature: of the InfoNCE softmax over cosines.
        anchor: weight of the squared distance from the starting weights.
        seed: batches and dropout.
        share: ``pseudo``: at most this share of the sentences is kept as pseudo-labelled,
            an equal part per relation (:func:`~model.adapt.pseudo.select`).
        relabel: ``pseudo``: label the sentences again half-way, with the trained encoder.
    """

    objective: str = DEFAULT_OBJECTIVE
    minutes: float = 15.0
    steps: int = 200
    batch_size: int = 64
    lr: float | None = None
    temperature: float = 0.05
    anchor: float = 0.0
    seed: int = 0
    share: float = 0.2
    relabel: bool = True

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise PipelineError(f"objective {self.objective!r} is unknown; use one of "
                                f"{', '.join(OBJECTIVES)}")
        if self.lr is None:  # frozen: set the objective's rate once, so records show it
            object.__setattr__(self, "lr", DEFAULT_LR.get(self.objective, 1e-4))
        for name in ("minutes", "lr", "temperature"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise PipelineError(f"--{name} {value}: give a positive number")
        if self.steps < 1 or self.batch_size < 2:
            raise PipelineError(f"--steps {self.steps} / --batch-size {self.batch_size}: give "
                                "at least 1 step of at least 2 sentences")
        if not (math.isfinite(self.anchor) and self.anchor >= 0):
            raise PipelineError(f"--anchor {self.anchor}: give 0 or a positive number")
        if not (isinstance(self.share, (int, float)) and 0 < self.share <= 1):
            raise PipelineError(f"--share {self.share}: give a share above 0 and at most 1")

    @property
    def rounds(self) -> int:
        """Times the sentences are labelled (``pseudo``), the first before any step."""
        return 0 if self.objective != "pseudo" else 1 + self.relabel


@dataclass(frozen=True)
class Plan:
    """What fits the budget: seconds per cached sentence (each view counted) and per step,
    the steps run, and how many of the sentences are adapted to."""

    cache_seconds: float
    step_seconds: float
    steps: int
    sentences: int

    def total(self, sentences: int) -> float:
        """Seconds the whole adaptation is expected to take."""
        return self.cache_seconds * sentences + self.step_seconds * self.steps


def digest(sentences: Sequence[Sentence]) -> str:
    """sha256 of the sentences as marked text, one per line: the data the model adapted to."""
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.marked().encode("utf-8") + b"\n")
    return h.hexdigest()


def over_length(model: FewShotModel, sentences: Sequence[Sentence]) -> list[int]:
    """Indices of the sentences longer than the encoder reads (markers included)."""
    encoder = model.encoder
    extra = 4 if encoder.config.markers else 0
    ids = encoder.tokenizer([list(s.tokens) for s in sentences],
                            is_split_into_words=True)["input_ids"]
    return [i for i, x in enumerate(ids) if len(x) + extra > encoder.config.max_length]


def tokenize(model: FewShotModel, sentences: Sequence[Sentence]) -> TokenizedSet:
    """Token ids of ``sentences``; refuses those longer than the encoder reads.

    Other commands cut a long sentence around its entities; here the text itself is what
    the encoder learns from, so a sentence that would be cut is refused, naming the first.
    """
    if not sentences:
        raise PipelineError("no sentences to adapt to; give a file with one sentence per line")
    long = over_length(model, sentences)
    if long:
        raise PipelineError(
            f"{len(long)} sentence(s) are longer than the encoder's "
            f"{model.encoder.config.max_length} tokens (the first is number {long[0] + 1}); "
            "shorten or drop them, or pass --skip-long to leave them out")
    return model.encoder.tokenize(sentences_table(sentences))


def views(model: FewShotModel, sentences: Sequence[Sentence], objective: str
          ) -> tuple[TokenizedSet, int]:
    """Token ids of the sentences, then (``masked``) of their entity-masked copies; and the
    offset from a sentence's row to its second view's (0: the same row, another dropout)."""
    tokens = tokenize(model, sentences)
    if objective != "masked":
        return tokens, 0
    mask = model.encoder.tokenizer.mask_token or model.encoder.tokenizer.unk_token
    copies = model.encoder.tokenize(sentences_table([masked_copy(s, mask) for s in sentences]))
    return TokenizedSet(tokens.ids + copies.ids, np.concatenate([tokens.head, copies.head]),
                        np.concatenate([tokens.tail, copies.tail]), tokens.pad_id), len(tokens)


def plan(model: FewShotModel, tokens: TokenizedSet, offset: int, cache: LowerCache,
         options: AdaptOptions, clock: Callable[[], float] = time.monotonic,
         relations: int = 0) -> Plan:
    """Time the frozen layers on a few sentences and one step here, and fit the work to the
    budget: every sentence when their pass through the frozen layers (and, for ``pseudo``,
    the top layer's labelling passes) and one step fit, otherwise as many as half the budget
    passes (the steps take the rest); a budget that cannot hold one batch of sentences and
    one step is refused. ``relations``: how many ``pseudo`` labels with."""
    views_per = 2 if offset else 1
    n = len(tokens) // views_per
    trains = options.objective in TRAINED
    timed = np.arange(min(n, TIMED_SENTENCES))
    start = clock()
    cache.states(model.encoder, tokens, np.concatenate([timed, timed + offset]))
    per_sentence = (clock() - start) / len(timed)  # all its views
    target = None
    if options.rounds:
        start = clock()
        with torch.no_grad():
            encode_rows(model.encoder, tokens, timed, cache, options.batch_size)
        per_sentence += (clock() - start) / len(timed) * options.rounds
        dim = model.prior.fallback.shape[0]
        target = PseudoTarget(np.zeros(len(tokens), dtype=np.int64), torch.zeros(relations, dim),
                              "euclidean", 1.0)
    start = clock()
    _step(model, tokens, offset, cache, _Trainer.of(model, options),
          timed[: options.batch_size], options, update=False, target=target)
    step = clock() - start if trains else 0.0
    budget = options.minutes * 60
    keep = n if per_sentence * n + step <= budget else int(
        min(budget / 2, budget - step) // per_sentence)
    if keep < min(n, options.batch_size):
        need = (per_sentence * min(n, options.batch_size) + step) / 60
        raise PipelineError(
            f"a budget of {options.minutes:g} min cannot fit one step: a batch of "
            f"{min(n, options.batch_size)} sentences takes about {per_sentence * 64:.1f} s "
            f"per 64 through the frozen layers and a step {step:.1f} s on this machine; give "
            f"--minutes {max(1, math.ceil(need * 2))} or more")
    left = budget - per_sentence * keep
    steps = options.steps if step == 0 else min(options.steps, int(left // step))
    return Plan(per_sentence / views_per, step, steps if trains else 0, keep)


@dataclass
class _Trainer:
    params: list[torch.nn.Parameter]
    start: list[torch.Tensor]
    optimizer: torch.optim.Optimizer

    @classmethod
    def of(cls, model: FewShotModel, options: AdaptOptions) -> _Trainer:
        params = [p for p in model.encoder.parameters() if p.requires_grad]
        return cls(params, [p.detach().clone() for p in params],
                   torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0))


def _step(model: FewShotModel, tokens: TokenizedSet, offset: int, cache: LowerCache,
          trainer: _Trainer, rows: np.ndarray, options: AdaptOptions, update: bool = True,
          target: PseudoTarget | None = None) -> float:
    """One step on ``rows``: contrastive with their second views (``rows + offset``, under
    other dropout; returns the InfoNCE loss), or with ``target`` the cross-entropy against
    their pseudo-labels."""
    if options.objective not in TRAINED:
        return 0.0
    encoder = model.encoder
    encoder.train()
    a = encode_rows(encoder, tokens, rows, cache, len(rows))  # (B, D)
    if target is not None:
        loss = target.loss(a, rows)
    else:
        b = encode_rows(encoder, tokens, rows + offset, cache, len(rows))  # (B, D)
        loss = info_nce(a, b, options.temperature)
    total = loss + options.anchor * anchor_penalty(trainer.params, trainer.start)
    trainer.optimizer.zero_grad(set_to_none=True)
    total.backward()
    if update:
        trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    encoder.eval()
    return float(loss.detach())


def adapt(model: FewShotModel, sentences: Sequence[Sentence], options: AdaptOptions,
          progress: bool = True, clock: Callable[[], float] = time.monotonic,
          say: Callable[[str], None] = print, cache: LowerCache | None = None,
          relations: RelationTexts | None = None) -> dict[str, Any]:
    """Adapt ``model``'s encoder to ``sentences`` in place; returns the adaptation record.

    The record holds the objective, how many sentences and their :func:`digest`, the steps
    run, the budget and the seconds taken, and the loss (InfoNCE or, for ``pseudo``, the
    cross-entropy; mean of the first and last tenth of the steps) or the moments folded in.
    ``cache`` (the frozen layers' outputs) may be shared between models of one encoder.
    ``relations`` (id -> name, description) are what ``pseudo`` labels with; it needs them.
    """
    if options.objective == "pseudo":
        check_relations(model, relations)
    began = clock()
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    tokens, offset = views(model, sentences, options.objective)
    n = len(sentences)
    cache = cache if cache is not None else LowerCache()
    model.eval()
    fitted = plan(model, tokens, offset, cache, options, clock, len(relations or ()))
    given = n
    if fitted.sentences < n:
        drawn = np.sort(rng.choice(n, size=fitted.sentences, replace=False))
        sentences = [sentences[i] for i in drawn]
        tokens, offset = views(model, sentences, options.objective)
        n = len(sentences)
        say(f"note: the budget holds {n:,} of the {given:,} sentences (their pass through the "
            "frozen layers in half of it); adapting to those, drawn with --seed; give more "
            "--minutes for all")
    say(f"estimate: about {fitted.total(len(tokens)) / 60:.1f} min on this machine "
        f"({n:,} sentences{' and their masked copies' if offset else ''} through the frozen "
        "layers, "
        f"{fitted.steps} steps of {fitted.step_seconds:.2f} s; budget {options.minutes:g} min)")
    cache.states(model.encoder, tokens, np.arange(len(tokens)), progress=progress)
    record: dict[str, Any] = {
        "objective": options.objective, "sentences": n, "given": given,
        "digest": digest(sentences), "budget_minutes": options.minutes,
        "options": dataclasses.asdict(options),
    }
    target, pool, rounds = None, np.arange(n), []
    if options.rounds:
        record.update(relations=len(relations), relations_digest=relations_digest(relations))
        target, stats = pseudo_labels(model, tokens, cache, relations, options.share,
                                      options.seed)
        pool = target.kept
        rounds.append(stats)
        record["labelling"] = rounds
    if options.objective in ("centre", "whiten"):
        mu, sigma, count = pooled_moments(model.encoder, tokens, cache)
        fold_moments(model.encoder, mu, sigma if options.objective == "whiten" else None)
        record.update(steps=0, token_states=count, mean_norm=float(mu.norm()),
                      spread=float(sigma.mean()))
    else:
        trainer = _Trainer.of(model, options)
        losses: list[float] = []
        deadline = began + options.minutes * 60
        for i in tqdm(range(fitted.steps), desc="adapt", unit="step", disable=not progress):
            if clock() > deadline:
                break
            if target is not None and options.relabel and i == fitted.steps // 2 and i > 0:
                before = target.labels
                target, stats = pseudo_labels(model, tokens, cache, relations, options.share,
                                              options.seed)
                both = (before >= 0) & (target.labels >= 0)
                stats["same_label"] = round(float((before[both] == target.labels[both]).mean()
                                                  if both.any() else 0.0), 4)
                pool = target.kept
                rounds.append(stats)
            rows = rng.choice(pool, size=min(options.batch_size, len(pool)), replace=False)
            losses.append(_step(model, tokens, offset, cache, trainer, rows, options,
                                target=target))
            if not math.isfinite(losses[-1]):
                raise PipelineError(f"the training loss became {losses[-1]} at step "
                                    f"{len(losses)}; lower --lr")
        tenth = max(1, len(losses) // 10)
        record.update(steps=len(losses), loss="cross-entropy" if target is not None else
                      "InfoNCE", loss_first=float(np.mean(losses[:tenth])),
                      loss_last=float(np.mean(losses[-tenth:])))
    model.eval()
    record["seconds"] = round(clock() - began, 1)
    return record


def adapted_checkpoint(source: Checkpoint, model: FewShotModel, record: dict[str, Any]
                       ) -> Checkpoint:
    """``source`` with ``model``'s encoder weights and ``record`` appended to its summary's
    ``adaptation`` list (a model adapted twice keeps both records); the rest is kept: config,
    graph, head weights, validation scores, the suspicion cutoff."""
    state = dict(source.state)
    state.update({f"encoder.{k}": v.detach().cpu()
                  for k, v in model.encoder.trainable_state().items()})
    summary = dict(source.summary or {})
    summary["adaptation"] = [*summary.get("adaptation", []), record]
    return dataclasses.replace(source, state=state, summary=summary, resume=None,
                               encoder_files=None)
