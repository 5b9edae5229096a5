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
* :func:`head_logits`, :func:`support_mean`, :func:`oversample`: episodes whose ways have
  unequal shots (a padded support and per-way counts), scored in one call.

Shapes:
    B episodes, S samples, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import nn

from model.posterior.logits import prototype_logits, similarity_logits
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.encoder.sentence import SentenceEncoder
    from model.posterior.langevin import LangevinConfig
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
    #: without it gets unequal shots oversampled to equal ones (:func:`head_logits`).
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


def unequal(support: torch.Tensor, shots: torch.Tensor | None) -> bool:
    """Whether ``shots`` says that some way has fewer than the padded K shots.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None
    """
    return shots is not None and bool((shots != support.shape[2]).any())


def shot_mask(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor | None:
    """1 for a way's real shots, 0 for its padding (None when every way has K).

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, N, K, 1) or None
    """
    if not unequal(support, shots):
        return None
    k = torch.arange(support.shape[2], device=support.device)
    return (k < shots[..., None].to(support.device)).to(support.dtype)[..., None]


def shot_counts(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor | int:
    """K, or each way's own count as a float tensor when they differ.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> int or (B, N, 1)
    """
    if not unequal(support, shots):
        return support.shape[2]
    return shots.to(device=support.device, dtype=support.dtype)[..., None]


def support_sum(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """Sum of each way's real shots (padding left out).

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, N, D)
    """
    mask = shot_mask(support, shots)
    return support.sum(2) if mask is None else (support * mask).sum(2)


def support_mean(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """Mean of each way's real shots; exactly ``support.mean(2)`` when every way has K.

    Shapes:
        support: (B, N, K, D) with every way's count >= 1, shots: (B, N) or None -> (B, N, D)
    """
    if not unequal(support, shots):
        return support.mean(2)
    return support_sum(support, shots) / shot_counts(support, shots)


def oversample(support: torch.Tensor, shots: torch.Tensor) -> torch.Tensor:
    """Every way's shots repeated in order up to K (slot j holds shot ``j mod k_r``): random
    oversampling to equal shots (Ochal et al., 2023) made deterministic, what a user of a
    method built for equal shots does.

    Shapes:
        support: (B, N, K, D), shots: (B, N) with every count >= 1 -> (B, N, K, D)
    """
    if bool((shots < 1).any()):
        raise PipelineError("this method needs K >= 1 support sentences for every way when "
                            "the ways have unequal shots; give every relation a sentence")
    k = torch.arange(support.shape[2], device=support.device)
    slot = k % shots[..., None].to(support.device)  # (B, N, K)
    return support.gather(2, slot[..., None].expand_as(support))


def head_logits(head: Head, support: torch.Tensor, query: torch.Tensor,
                h: torch.Tensor | None, generator: torch.Generator | None = None,
                shots: torch.Tensor | None = None) -> torch.Tensor:
    """``head.sample_logits`` of an episode batch whose ways may have unequal shots.

    ``support`` is padded to the largest count K and ``shots`` holds each way's count. When
    every way has K (or ``shots`` is None) the head is called exactly as for a balanced
    episode; otherwise a head with ``unequal_shots`` gets the counts, and any other head the
    support oversampled to K shots per way (:func:`oversample`).

    Shapes:
        support: (B, N, K, D), query: (B, Q, D), h: (B, N, D) or None, shots: (B, N) or None
        -> (B, S, Q, N)
    """
    if not unequal(support, shots):
        return head.sample_logits(support, query, h, generator)
    if getattr(head, "unequal_shots", False):
        return head.sample_logits(support, query, h, generator, shots=shots)
    return head.sample_logits(oversample(support, shots), query, h, generator)


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

    def prior_states(self) -> None:
        return None

    def prior_means(self, states: None, rows: torch.Tensor, text: None = None) -> None:
        return None


def normalised(v: torch.Tensor, support: torch.Tensor, shots: torch.Tensor | None
               ) -> torch.Tensor:
    """Prototypes rescaled to the mean length of their way's support encodings.

    A mean of k encodings is shorter than they are (by the spread it averages away, more so
    for larger k), so with Euclidean or dot logits it lies closer to every query and a way
    with more shots draws predictions; at the encodings' own length only its direction
    counts (normalised, cosine-like prototypes).

    Shapes:
        v: (B, N, D), support: (B, N, K, D), shots: (B, N) or None -> (B, N, D)
    """
    length = support_mean(torch.linalg.vector_norm(support, dim=-1, keepdim=True), shots)
    return v * (length / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp(min=1e-12))


def pooled_scatter(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """``tr Sigma``, the expected squared distance of an encoding from its relation's mean,
    estimated from the episode's own support: every way's scatter around its mean, pooled
    over the ways (``sum |x - m_r|^2 / sum (k_r - 1)``); 0 when no way has two shots.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, 1, 1)
    """
    mask = shot_mask(support, shots)
    resid = (support - support_mean(support, shots)[:, :, None]).pow(2).sum(-1, keepdim=True)
    if mask is not None:
        resid = resid * mask
    k = shot_counts(support, shots)
    dof = ((k - 1) * torch.ones(support.shape[:2] + (1,), dtype=support.dtype,
                                device=support.device)).clamp(min=0).sum((1, 2))  # (B,)
    total = resid.sum((1, 2, 3))
    return torch.where(dof > 0, total / dof.clamp(min=1), torch.zeros_like(total)).view(-1, 1, 1)


#: How a prototype baseline scores ways with unequal shots (``model.langevin.prototype_scoring``).
PROTOTYPE_SCORINGS = ("mean", "normalised", "unbiased")


def scored_prototypes(query: torch.Tensor, v: torch.Tensor, support: torch.Tensor,
                      shots: torch.Tensor | None, spread: torch.Tensor | float, scoring: str,
                      similarity: str, temperature: float,
                      extra: torch.Tensor | None = None) -> torch.Tensor:
    """``sim(q, v) / T`` of prototypes ``v`` built from ``support``, as ``scoring`` says.

    ``mean``: as they are. ``normalised``: each at the mean length of its way's encodings
    (:func:`normalised`). ``unbiased`` (Euclidean): the squared distance less the part its
    prototype's own sampling noise adds, ``E |q - v_r|^2 = |q - mu_r|^2 + tr Sigma * spread_r``
    (spread 1/k_r for a support mean), with ``tr Sigma`` pooled over the episode's ways
    (:func:`pooled_scatter`), so a way with more shots is no closer to every query. It moves a
    query's logits by the same amount when every way has the same shots, so balanced episodes
    score exactly as ``mean``; with dot similarity the dot product is unbiased already.
    ``extra`` is any further expected squared distance a way's prototype adds (a prior
    mean's own error, for ``proto_label``), subtracted likewise.

    Shapes:
        query: (B, Q, D), v: (B, N, D), support: (B, N, K, D), shots: (B, N) or None,
        spread: (B, N, 1) or a number, extra: (B, N, 1) or None -> (B, Q, N)
    """
    if scoring == "normalised":
        v = normalised(v, support, shots)
    logits = similarity_logits(query, v, similarity, temperature)
    if scoring == "unbiased" and similarity == "euclidean":
        bias = pooled_scatter(support, shots) * spread  # (B, N, 1)
        if extra is not None:
            bias = bias + extra
        logits = logits + 0.5 * bias.transpose(1, 2) / temperature
    return logits


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
    predictive averages over the samples. Shared by Versa and BMAML."""

    def __init__(self, config: LangevinConfig) -> None:
        super().__init__()
        self.config = config

    def noisy(self) -> bool:
        """Whether to sample (``noise_train``/``noise_eval``); else one point estimate."""
        return self.config.noise_train if self.training else self.config.noise_eval

    def sample_prototypes(self, support: torch.Tensor,
                          generator: torch.Generator | None = None) -> torch.Tensor:
        """S prototype samples per way.

        Shapes:
            support: (B, N, K, D) -> (B, S, N, D)
        """
        raise NotImplementedError

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """Query logits under every prototype sample.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, S, Q, N)
        """
        v = self.sample_prototypes(support, generator)  # (B, S, N, D)
        return prototype_logits(query, v, self.config.similarity, self.config.temperature)
