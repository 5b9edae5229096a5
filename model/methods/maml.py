"""MAML: a linear softmax head adapted to each episode by gradient steps (Finn et al., 2017).

MAML learns an initialisation from which a few gradient steps on an episode's support set
give a good classifier for its queries, and trains that initialisation (and the network
under it) through the steps, second order. Here the adapted part is a linear softmax head
over the sentence encodings, one row per way,

    z_n(x) = (w_n . x + b_n) / T                                      (T: model.langevin)

and its initialisation is Proto-MAML's (Triantafillou et al., 2020): the prototypical
network written as a linear layer, with a learned diagonal metric gamma (D,),

    c_n = mean_k x_{n,k},   w_n^0 = gamma * c_n,   b_n^0 = -1/2 c_n . (gamma * c_n)

so that ``z_n(x) = -(x - c_n)^T diag(gamma) (x - c_n) / 2T`` up to a term shared by every
way; with gamma = 1 (its starting value) and no steps this is exactly ``proto``. Then, with
the M = N K support sentences and the mean cross-entropy L_S,

    W <- W - alpha_s dL_S/dW,   dL_S/dW = (P - Y)^T X / (M T),   dL_S/db = 1^T (P - Y) / (M T)

for s = 1 .. :data:`INNER_STEPS`, and the queries are scored by the adapted head. The
gradients come from :func:`torch.func.grad`, whose result stays differentiable, so the
outer loss reaches gamma, the per-step learning rates alpha_s (learned, as in Meta-SGD and
MAML++) and the encoder through the inner steps (second order).

Why Proto-MAML's initialisation rather than MAML's one learned W^0: the ways of an episode
are new relations in an arbitrary order and N changes between episodes (5 or 10), so a
fixed (N, D) matrix cannot be the start; it has to be built from the episode. A learned
vector shared by every row (or a shared offset added to c_n) would add the same amount to
every way's logit and cancel in the softmax and in its gradient, so it could learn nothing.
The support mean gives each way a different, sensible start (proto's classifier, which the
steps then refine on the support), and gamma is the learned part of the start.

Where ours differs from the papers:

* Only the head adapts in the inner loop (as ANIL, Raghu et al., 2020); MAML and Proto-MAML
  adapt every weight. The encoder is shared with the other methods, trains in the outer
  loop, and encodes each sentence once per episode.
* The initialisation has the learned metric gamma (Proto-MAML's has none) and the
  project's temperature T; learned per-step learning rates instead of a fixed alpha.
* Episodes, encoder, optimizer and budget are the project's (see :mod:`model.training.loop`).
* Ways with unequal shots are scored as the average of ``model.langevin.balanced_members``
  adaptations, each to the support with every way cut to the smallest way's count
  (:mod:`model.posterior.subsample`): oversampled, the inner loop fitted five copies of one
  sentence as tightly as five sentences and the way with more sentences drew the queries.

Evaluation calls the head under ``torch.no_grad()``; the inner loop turns gradients back
on for itself, and outside training (``self.training`` False) everything is detached
first, so no graph outlives the call.

The rates alpha_s start at :data:`INNER_LR` = 10, chosen on split_0's validation relations
with a model trained at rate 1 (5w5s: 87.92% at 1, 87.94 at 10, 88.04 at 30, 86.33 at 100;
10 keeps clear of that drop). 1-shot is the same for any rate: proto's start already fits
a single support sentence per way, so the support gradient is ~0.
With the project's ``lr_head`` (1e-3, 300 steps) they then move by about 3% and gamma by
under 10%, so the method learns mostly through the encoder.

Cost: the S inner steps add ~2S (B, M, D) x (D, N) products and their second-order
backward: 5-13 ms per training episode (5w1s-10w5s, D = 1536, one thread on the shared
CPU; first-order 4-7 ms, proto's head 0.4-1.1 ms), against ~200 ms for the encoder.

Shapes:
    B episodes, N ways, K shots, M = N K support sentences, Q queries, D encoding size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.func import grad

from model.methods.base import PriorFreeHead, require_shots
from model.methods.registry import Method

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.prior.graph import RelationGraph

#: Gradient steps on the support set per episode (training and evaluation alike).
INNER_STEPS = 5
#: Starting value of every step's learning rate alpha_s (learned from there).
INNER_LR = 10.0


def linear_logits(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """``(x . w_n + b_n) / T`` for every sentence and way.

    Shapes:
        x: (B, M, D), w: (B, N, D), b: (B, N) -> (B, M, N)
    """
    return (x @ w.transpose(-1, -2) + b[:, None, :]) / temperature


def support_loss(params: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                 y: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean cross-entropy of each episode's support, summed over the episodes (so the
    gradient with respect to one episode's head is that episode's own).

    Shapes:
        params: w (B, N, D), b (B, N); x: (B, M, D), y: (B, M) -> ()
    """
    w, b = params
    logits = linear_logits(x, w, b, temperature)  # (B, M, N)
    nll = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
    return nll / x.shape[1]


def adapt(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
          lrs: torch.Tensor, temperature: float, first_order: bool = False
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient steps on the support loss, one per learning rate in ``lrs``.

    The steps stay differentiable with respect to ``w``, ``b``, ``x`` and ``lrs`` (second
    order); ``first_order`` treats each step's gradient as a constant (FOMAML).

    Shapes:
        w: (B, N, D), b: (B, N), x: (B, M, D), y: (B, M), lrs: (S,) -> w (B, N, D), b (B, N)
    """
    step = grad(support_loss)
    for lr in lrs:
        gw, gb = step((w, b), x, y, temperature)
        if first_order:
            gw, gb = gw.detach(), gb.detach()
        w, b = w - lr * gw, b - lr * gb
    return w, b


class MamlHead(PriorFreeHead):
    """Proto-MAML initialisation, a few second-order gradient steps, adapted-head logits."""

    # The inner loop's softmax runs over every way, so each row adapts to all the support.
    couples_ways = True

    def __init__(self, temperature: float, dim: int, steps: int = INNER_STEPS,
                 lr: float = INNER_LR, first_order: bool = False, members: int = 0) -> None:
        """``members``: balanced subsamples averaged on unequal shots (0: oversampling;
        ``model.langevin.balanced_members``)."""
        super().__init__()
        if steps < 0 or lr <= 0:
            raise ValueError(f"maml needs steps >= 0 and a learning rate > 0, got {steps}, {lr}")
        self.temperature = temperature
        self.balanced_members = members
        self.first_order = first_order
        self.log_metric = nn.Parameter(torch.zeros(dim))  # log gamma
        self.log_lr = nn.Parameter(torch.full((steps,), math.log(lr)))  # log alpha_s

    def initial(self, support: torch.Tensor, gamma: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Proto-MAML's start: ``w_n = gamma * c_n``, ``b_n = -1/2 c_n . (gamma * c_n)``.

        Shapes:
            support: (B, N, K, D), gamma: (D,) -> w (B, N, D), b (B, N)
        """
        c = support.mean(2)  # (B, N, D)
        w = gamma * c
        return w, -0.5 * (w * c).sum(-1)

    def adapted(self, support: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head after the inner steps on ``support``; detached outside training.

        Shapes:
            support: (B, N, K, D) -> w (B, N, D), b (B, N)
        """
        require_shots(support, "maml")  # it adapts to the support set
        bsz, n, k, d = support.shape
        gamma, lrs = self.log_metric.exp(), self.log_lr.exp()
        if not self.training:  # nothing to train: no graph beyond the inner loop's own
            support, gamma, lrs = support.detach(), gamma.detach(), lrs.detach()
        x = support.reshape(bsz, n * k, d)  # (B, M, D)
        y = torch.arange(n, device=support.device).repeat_interleave(k).expand(bsz, -1)  # (B, M)
        with torch.enable_grad():  # evaluation calls the head under no_grad
            w, b = self.initial(support, gamma)
            w, b = adapt(w, b, x, y, lrs, self.temperature, self.first_order)
        if not self.training:
            w, b = w.detach(), b.detach()
        return w, b

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """Query logits under the adapted head, as one "sample" (S = 1); their log-softmax
        is :meth:`log_predictive`.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, 1, Q, N)
        """
        w, b = self.adapted(support)
        if not self.training:
            query = query.detach()
        return linear_logits(query, w, b, self.temperature)[:, None]


def _maml(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> MamlHead:
    return MamlHead(config.langevin.temperature, dim,
                    members=config.langevin.balanced_members)


METHODS = (
    Method("maml", _maml, "linear head adapted by second-order gradient steps from a "
           "Proto-MAML start (Finn et al.; Triantafillou et al.)", similarity="euclidean", seed=5),
)
