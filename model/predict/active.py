"""Which sentence should the user label next: ranking a pool of unlabelled sentences.

A user with a few labelled sentences per relation (the support) and a pool of unlabelled
ones labels the pool sentence a strategy ranks first, adds it to the support, refits and
repeats. Each strategy gives every pool sentence a score, larger meaning "label this
first", read from the per-sample logits of the model's head by
:func:`model.evaluation.uncertainty.uncertainty_scores`:

* ``bald``: the mutual information between the sentence's label and the prototypes
  (Houlsby et al., 2011): the sentences whose label the posterior samples disagree on,
  so that labelling them teaches the prototypes most. Needs S > 1 posterior samples
  (REGRAB); a head with one deterministic prototype per relation has none.
* ``entropy``: the entropy of the predictive distribution (the least sure sentences).
* ``margin``: one minus the gap between the two most probable relations (the sentences
  closest to a decision boundary).
* ``typiclust``: the most typical sentence of the largest cluster of encodings that holds
  no labelled sentence (:mod:`model.predict.typiclust`); it reads the encodings, not the
  logits, and ranks a pool by repeated picks.
* ``random``: a seeded uniform draw, the floor every other strategy should beat.

``regrab-suggest`` ranks a user's pool with them; the ``active_labelling`` stage simulates a
user labelling with each (:mod:`model.predict.simulation`).

Shapes:
    S posterior samples, P pool sentences, N ways (candidate relations); ``...`` any
    leading batch axes.
"""

from __future__ import annotations

import numpy as np
import torch

from model.evaluation.uncertainty import uncertainty_scores
from model.predict.config import STRATEGIES
from pipeline.errors import PipelineError

#: The uncertainty score each strategy ranks by (``random`` reads none).
SCORE = {"bald": "mutual_information", "entropy": "entropy", "margin": "margin"}
#: Strategies that need S > 1 posterior samples.
NEEDS_SAMPLES = ("bald",)
#: Strategies that read the encodings rather than the logits (model.predict.typiclust).
READS_ENCODINGS = ("typiclust",)


#: What ``regrab-suggest`` ranks by unless told: ``typiclust``, ahead of random labels and of
#: ``bald`` over the simulated labelling curves on NYT-25 and SemEval (docs/results.md).
DEFAULT_STRATEGY = "typiclust"


def check_strategy(strategy: str, samples: int, what: str = "this model",
                   fix: str = "use entropy or margin, or a regrab checkpoint") -> str:
    """``strategy`` when it is known and ``what``, a head with ``samples`` posterior samples,
    can rank by it; ``fix`` ends the message of one it cannot.

    Raises:
        PipelineError: an unknown strategy, or ``bald`` for a head without posterior samples.
    """
    if strategy not in STRATEGIES:
        raise PipelineError(f"strategy {strategy!r} is unknown; use one of "
                            f"{', '.join(STRATEGIES)}")
    if strategy in NEEDS_SAMPLES and samples < 2:
        raise PipelineError(
            f"strategy {strategy} ranks by the disagreement of posterior samples of the "
            f"prototypes, and {what} has none (one fixed prototype per relation, as proto, "
            f"proto_label and mtb, or regrab with model.langevin.noise_eval false); {fix}")
    return strategy


def acquisition_scores(strategy: str, sample_logits: torch.Tensor,
                       what: str = "this model") -> torch.Tensor:
    """Each pool sentence's score under ``strategy``: larger is labelled first.

    ``random`` and ``typiclust`` have no score of the logits: use :func:`random_scores` and
    :mod:`model.predict.typiclust`.

    Shapes:
        sample_logits: (..., S, P, N) -> (..., P), float64
    """
    check_strategy(strategy, sample_logits.shape[-3], what)
    if strategy == "random" or strategy in READS_ENCODINGS:
        raise ValueError(f"{strategy} does not rank by the logits (random_scores, "
                         "model.predict.typiclust)")
    return uncertainty_scores(sample_logits)[SCORE[strategy]]


def random_scores(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Seeded uniform scores: the ``random`` strategy's (a random order, ties impossible).

    Shapes:
        -> ``shape``, float64, on the generator's device
    """
    return torch.rand(shape, generator=generator, dtype=torch.float64,
                      device=generator.device)


def ranking(scores: np.ndarray) -> np.ndarray:
    """Pool positions in the order to label them: highest score first, ties (and NaN,
    last) in pool order.

    Shapes:
        scores: (P,) -> (P,)
    """
    scores = np.asarray(scores, dtype=np.float64)
    return np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")


def pick(scores: torch.Tensor, labelled: torch.Tensor) -> torch.Tensor:
    """The pool position to label next in each row: the best-scoring sentence not yet
    labelled (the first of equals).

    Shapes:
        scores, labelled: (..., P) -> (...,) int64
    """
    if bool(labelled.all(-1).any()):
        raise ValueError("a row has no unlabelled pool sentence left")
    masked = scores.masked_fill(labelled, -torch.inf)
    return masked.argmax(-1)
