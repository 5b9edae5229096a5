"""REGRAB: prototypes with a graph prior, sampled by Langevin dynamics (paper section 4).

``log p(y_Q | x_Q, x_S, y_S, G) ~= log (1/S) sum_s p(y_Q | x_Q, v_s)`` with ``v_s`` drawn by
:class:`~model.posterior.langevin.LangevinSampler`
from ``p(v | x_S, y_S, G)`` whose prior mean comes
from :class:`~model.prior.gcn.GraphPrior` (Eq. 11, computed with logsumexp). Training
maximises it on the queries; every piece is differentiable, so gradients reach the encoder
through the support and the query encodings and through the Langevin steps, and reach the GCN
through h_r, and reach the sampler's scales (lambda, sigma^2) when they are learned.
Zero-shot (K = 0): the prototypes come from the prior alone (:mod:`model.posterior.langevin`).

Evaluation keeps sampling when ``noise_eval`` is on, with a seeded generator passed in by
the caller, so the predictive is a real average over S posterior samples and repeats.

Shapes:
    B episodes, S samples, N ways, K shots, Q queries (all ways together), D encoding size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from model.methods.base import mc_log_predictive
from model.methods.registry import Method
from model.posterior.config import LangevinConfig
from model.posterior.langevin import LangevinSampler
from model.posterior.logits import prototype_logits
from model.posterior.shots import head_logits
from model.posterior.target import heldout_scales, log_evidence
from model.prior.gcn import GraphPrior
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.config import RegrabConfig


class RegrabHead(nn.Module):
    """Posterior over prototypes (graph prior x support likelihood) and the MC predictive.

    With ``prior=None`` the prior mean is 0, i.e. a standard normal prior and no graph (the
    ``regrab_no_prior`` ablation).
    """

    def __init__(self, config: LangevinConfig, prior: GraphPrior | None, dim: int) -> None:
        super().__init__()
        self.config = config
        self.prior = prior
        self.dim = dim
        self.sampler = LangevinSampler(config)
        # A softmax likelihood normalises over the ways, so each prototype's posterior
        # depends on every way's support; the gaussian one factorises per way.
        self.couples_ways = config.likelihood != "gaussian"
        # The gaussian posterior takes each way's own count; the softmax ones get unequal
        # shots oversampled (model.methods.base.head_logits).
        self.unequal_shots = config.likelihood == "gaussian"

    def prior_states(self) -> torch.Tensor | None:
        """GCN output for the whole graph, computed once per step or evaluation.

        Shapes:
            -> (R, D) or None without a graph
        """
        return None if self.prior is None else self.prior.node_states()

    def prior_means(self, states: torch.Tensor | None, rows: torch.Tensor,
                    text: torch.Tensor | None = None) -> torch.Tensor:
        """h_r for the ways of each episode (``rows`` from :meth:`GraphPrior.index`).

        ``states=None`` computes only the rows needed (cheapest for one training episode);
        ``text`` passes the rows' label encodings computed just now (see
        :meth:`GraphPrior.forward`).

        Shapes:
            states: (R, D) or None, rows: (B, N), text: (B, N, D) or None -> (B, N, D)
        """
        if self.prior is None:
            return torch.zeros(*rows.shape, self.dim, device=rows.device)
        if states is None or text is not None:
            return self.prior(rows, text)
        h = states[rows.clamp(min=0)]  # (B, N, D)
        unknown = (rows < 0)[..., None]
        return torch.where(unknown, self.prior.fallback.expand_as(h), h)

    def sample_logits(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor,
        generator: torch.Generator | None = None,
        shots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Query logits under every posterior sample of the prototypes.

        Shapes:
            support: (B, N, K, D) (K may be 0), query: (B, Q, D), h: (B, N, D),
            shots: (B, N) or None (each way's count of the padded support) -> (B, S, Q, N)
        """
        if support.shape[2] == 0 and self.prior is None:
            raise PipelineError(
                "zero-shot needs the graph prior; this method has none (use regrab)"
            )
        if support.shape[2] == 0 and self.training and self.prior.config.zero_shot_mean:
            # The zero-shot rule itself, v = h: samples of N(h, I / lambda) would bury h
            # under noise of norm sqrt(D / lambda) (lambda starts at 1).
            return prototype_logits(query, h[:, None], self.config.similarity,
                                    self.config.temperature)
        return self.sampler.sample_logits(support, query, h, generator, shots)

    def evidence(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """Log marginal likelihood of labelled sentences per way; None unless the likelihood
        is ``gaussian`` with a proper prior (the closed form needs both).

        Shapes:
            x: (B, N, n, D), h: (B, N, D) -> (B, N)
        """
        if self.couples_ways or self.config.prior_precision <= 0:
            return None
        return log_evidence(x, h, self.sampler.precision, self.sampler.variance)

    @torch.no_grad()
    def fit_heldout(self, groups: list[torch.Tensor], h: torch.Tensor
                    ) -> tuple[float, float] | None:
        """Set lambda and sigma^2 by empirical Bayes on held-out relations (``scales:
        heldout`` only); returns them, else None.

        Shapes:
            groups: one (n_r, D) tensor per relation, h: (R, D)
        """
        if self.sampler.mode != "heldout":
            return None
        lam, var = heldout_scales([x.double() for x in groups], h.double())
        self.sampler.set_scales(lam, var)
        return lam, var

    def log_predictive(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor,
        generator: torch.Generator | None = None,
        shots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """MC estimate of ``log p(y_q = n | x_q, x_S, y_S, G)`` for every query and way.

        Shapes:
            support: (B, N, K, D) (K may be 0), query: (B, Q, D), h: (B, N, D),
            shots: (B, N) or None -> (B, Q, N)
        """
        return mc_log_predictive(head_logits(self, support, query, h, generator, shots))


def _regrab(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> RegrabHead:
    if graph is None:
        raise PipelineError("method regrab needs the relation graph; pass --graph and --features")
    return RegrabHead(config.langevin, GraphPrior(config.prior, graph, dim), dim)


def _regrab_no_prior(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> RegrabHead:
    return RegrabHead(config.langevin, None, dim)


METHODS = (
    Method("regrab", _regrab, "prototypes with the graph (and label) prior, Langevin "
           "posterior samples (ours)", uses_graph=True, zero_shot=True, seed=0, samples=True),
    Method("regrab_no_prior", _regrab_no_prior,
           "REGRAB with h_r = 0: the posterior without the graph prior (ablation)", seed=1,
           samples=True),
)
