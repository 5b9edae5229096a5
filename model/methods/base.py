"""What every method shares: the :class:`Head` interface, the model, the predictive helpers.

A method module imports this module, :class:`~model.methods.registry.Method` and helpers
(posterior, prior, encoder), never another method: what two methods share lives here.

* :class:`Head`: what training, evaluation and prediction ask of a method's head.
* :class:`FewShotModel`: the sentence encoder plus one head.
* :func:`mc_log_predictive`: the Monte Carlo predictive over posterior samples (Eq. 11).
* :class:`PredictiveHead`, :class:`PriorFreeHead`: heads whose predictive is that average,
  without an evidence term (and without a graph prior).
* :class:`PrototypeHead`: support-mean prototypes (``proto``, ``mtb``, the untrained floor).
* :class:`SampledPrototypeHead`, :func:`gaussian_samples`: prototype samples compared to
  the queries (``versa``, ``bmaml``).
* :func:`require_shots`, :func:`episode_chunks`: refusing K = 0, scoring in chunks.
* ways with unequal shots (a padded support and per-way counts) are scored in one call by
  :func:`~model.posterior.shots.head_logits` (:mod:`model.posterior.shots`; the heads built
  for equal shots that fit the support, maml, versa and bmaml, average balanced subsamples,
  :mod:`model.posterior.subsample`).

Shapes:
    B episodes, S samples, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import nn

from model.posterior.logits import prototype_logits
from model.posterior.shots import head_logits, scored_prototypes, shot_counts, support_mean
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.encoder.sentence import SentenceEncoder
    from model.posterior.config import LangevinConfig
    from model.prior.gcn import GraphPrior


@runtime_checkable
class Head(Protocol):
    """What training, evaluation and prediction ask of a method's head.

    Shapes:
        support (B, N, K, D), query (B, Q, D), h (B, N, D) or None, rows (B, N).
    """

    #: The graph prior (None for methods without one).
    prior: GraphPrior | None
    #: Whether one way's prototype depends on other ways' support.
    couples_ways: bool
    #: Whether ``sample_logits`` takes ``shots`` (per-way counts of a padded support); a head
    #: without it gets unequal shots oversampled to equal ones (:func:`head_logits`), or, when
    #: it has ``balanced_members`` above 0, the average of that many balanced subsamples
    #: (:mod:`model.posterior.subsample`; optional, 0 when absent).
    unequal_shots: bool

    def prior_states(self) -> torch.Tensor | None:
        """Prior means of every graph relation, computed once per evaluation (or None)."""

    def prior_means(self, states: torch.Tensor | None, rows: torch.Tensor,
                    text: torch.Tensor | None = None) -> torch.Tensor | None:
        """h_r for the ways of each episode (None for methods without a prior)."""

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """Query logits under each posterior sample: (B, S, Q, N), S = 1 if deterministic."""

    def log_predictive(self, support: torch.Tensor, query: torch.Tensor,
                       h: torch.Tensor | None, generator: torch.Generator | None = None
                       ) -> torch.Tensor:
        """``log p(y_q = n | ...)``: (B, Q, N)."""

    def evidence(self, x: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor | None:
        """Log marginal likelihood of labelled sentences per way, (B, N), for the
        empirical-Bayes training term; None when the method has no such term."""

    def fit_heldout(self, groups: list[torch.Tensor], h: torch.Tensor) -> tuple | None:
        """Re-estimate scales from held-out relations' encodings (one (n_r, D) tensor per
        relation, h (R, D)); the new values, or None when the method has none to fit."""


class FewShotModel(nn.Module):
    """Encoder + head; the head is REGRAB's or a baseline's (see :mod:`model.methods`)."""

    def __init__(self, config: RegrabConfig, encoder: SentenceEncoder, head: Head) -> None:
        """``config`` is the config the model was built from (a checkpoint stores it)."""
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.head = head

    @property
    def prior(self) -> GraphPrior | None:
        return self.head.prior

    def rows(self, relations: list[str]) -> torch.Tensor:
        """Graph rows of relation ids (all -1 without a graph)."""
        if self.prior is None:
            return torch.full((len(relations),), -1, dtype=torch.long)
        return self.prior.index(relations)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Weights a checkpoint must store: trained encoder layers and the whole head."""
        state = {f"encoder.{k}": v for k, v in self.encoder.trainable_state().items()}
        state.update({f"head.{k}": v for k, v in self.head.state_dict().items()})
        return state


def mc_log_predictive(logits: torch.Tensor) -> torch.Tensor:
    """``log (1/S) sum_s softmax(logits_s)`` computed stably with logsumexp.

    Shapes:
        logits: (..., S, Q, N) -> (..., Q, N)
    """
    log_p = torch.log_softmax(logits, dim=-1)  # (..., S, Q, N)
    return torch.logsumexp(log_p, dim=-3) - math.log(logits.shape[-3])


def require_shots(support: torch.Tensor, method: str) -> None:
    """Refuse episodes without support sentences (K = 0): ``method`` has no prior to
    classify from.

    Shapes:
        support: (B, N, K, D)
    """
    if support.shape[2] == 0:
        raise PipelineError(f"{method} needs K >= 1 support sentences per way (it has no "
                            "prior to classify from); use regrab for zero-shot")


def episode_chunks(scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   support: torch.Tensor, query: torch.Tensor, episodes: int) -> torch.Tensor:
    """``scores(support, query)`` over chunks of ``episodes`` episodes (at least one), as one
    "sample" (S = 1). Exact, since episodes are independent; it bounds evaluation memory.

    Shapes:
        support: (B, N, K, D), query: (B, Q, D); scores -> (b, Q, N) -> (B, 1, Q, N)
    """
    step = max(1, episodes)
    parts = [scores(support[i:i + step], query[i:i + step])
             for i in range(0, support.shape[0], step)]
    return torch.cat(parts)[:, None]  # (B, 1, Q, N)


class PredictiveHead(nn.Module):
    """A head with no evidence term and nothing to fit on held-out relations, whose
    predictive is the Monte Carlo average of its :meth:`sample_logits` samples.

    Subclasses define ``sample_logits(support, query, h, generator) -> (B, S, Q, N)``.
    """

    def evidence(self, x: torch.Tensor, h: torch.Tensor | None) -> None:
        return None

    def fit_heldout(self, groups: list[torch.Tensor], h: torch.Tensor) -> None:
        return None

    def log_predictive(self, support: torch.Tensor, query: torch.Tensor,
                       h: torch.Tensor | None = None, generator: torch.Generator | None = None,
                       shots: torch.Tensor | None = None) -> torch.Tensor:
        """``log (1/S) sum_s softmax(logits_s)`` over the samples of :meth:`sample_logits`;
        with one sample (S = 1) the log-softmax of its logits, exactly.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), h: (B, N, D) or None,
            shots: (B, N) or None -> (B, Q, N)
        """
        return mc_log_predictive(head_logits(self, support, query, h, generator, shots))


class PriorFreeHead(PredictiveHead):
    """A :class:`PredictiveHead` without a graph prior: no h_r (``prior_means`` is None).

    Subclasses whose ways share their support set ``couples_ways = True``.
    """

    prior = None
    couples_ways = False
    unequal_shots = False
    balanced_members = 0

    def prior_states(self) -> None:
        return None

    def prior_means(self, states: None, rows: torch.Tensor, text: None = None) -> None:
        return None


class PrototypeHead(PriorFreeHead):
    """Prototype = mean support encoding; softmax over ``sim / T``, ways with unequal shots
    scored as ``scoring`` says (:func:`scored_prototypes`)."""

    unequal_shots = True

    def __init__(self, similarity: str, temperature: float, scoring: str = "mean") -> None:
        super().__init__()
        self.similarity = similarity
        self.temperature = temperature
        self.scoring = scoring

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None,
                      shots: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of every query against the prototypes, as one "sample" (S = 1).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), shots: (B, N) or None -> (B, 1, Q, N)
        """
        require_shots(support, "a prototype baseline")
        v = support_mean(support, shots)  # (B, N, D)
        spread = 1.0 / shot_counts(support, shots)
        return scored_prototypes(query, v, support, shots, spread, self.scoring,
                                 self.similarity, self.temperature)[:, None]


def gaussian_samples(mean: torch.Tensor, std: torch.Tensor, samples: int,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """``mean + std * z`` for ``samples`` draws ``z ~ N(0, I)`` (reparameterised).

    Shapes:
        mean: (B, N, D), std: broadcast to (B, S, N, D) -> (B, S, N, D), S = ``samples``
    """
    b, n, d = mean.shape
    z = torch.randn((b, samples, n, d), generator=generator,
                    device=mean.device, dtype=mean.dtype)  # (B, S, N, D)
    return torch.addcmul(mean[:, None], std, z)


class SampledPrototypeHead(PriorFreeHead):
    """Prototype samples drawn from the support by :meth:`sample_prototypes`, each compared
    to the queries with the project's similarity and temperature (``model.langevin``); the
    predictive averages over the samples. Shared by Versa and BMAML; unequal shots are
    scored as ``model.langevin.balanced_members`` says."""

    def __init__(self, config: LangevinConfig) -> None:
        super().__init__()
        self.config = config
        self.balanced_members = config.balanced_members

    def noisy(self) -> bool:
        """Whether to sample (``noise_train``/``noise_eval``); else one point estimate."""
        return self.config.noise_train if self.training else self.config.noise_eval

    def draws(self) -> int:
        """S, the prototype samples drawn per episode now (training or evaluation)."""
        raise NotImplementedError

    def sample_prototypes(self, support: torch.Tensor,
                          generator: torch.Generator | None = None,
                          draws: int | None = None) -> torch.Tensor:
        """S prototype samples per way (``draws`` of them when given, else :meth:`draws`).

        Shapes:
            support: (B, N, K, D) -> (B, S, N, D)
        """
        raise NotImplementedError

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None,
                      draws: int | None = None) -> torch.Tensor:
        """Query logits under every prototype sample; ``draws`` samples when given (the
        balanced members of :mod:`model.posterior.subsample` share the head's S).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, S, Q, N)
        """
        v = self.sample_prototypes(support, generator, draws)  # (B, S, N, D)
        return prototype_logits(query, v, self.config.similarity, self.config.temperature)


def metric_log_gain(temperature: float) -> nn.Parameter | None:
    """log g of a head's fixed Euclidean metric, g starting at 1 / T; None at T = 0 (no metric).

    The GNN, SNAIL and pair heads add ``-g |e_i - e_j|^2 / 2`` beside their learned scores
    (``metric_temperature`` in their configs).
    """
    return nn.Parameter(torch.tensor(1.0 / temperature).log()) if temperature > 0 else None
