"""Baselines that share REGRAB's encoder, episodes and training loop.

* ``mtb``: prototypes are the support means, dot-product similarity (Baldini Soares et al.,
  2019, as the paper uses it: a prototypical network with dot product).
* ``proto``: prototypes are the support means, Euclidean similarity (Snell et al., 2017).
* ``regrab_no_prior``: REGRAB with h_r = 0, i.e. a standard normal prior and no graph.

All use the temperature of the ``model`` section, so they differ from REGRAB only in how
prototypes are formed. ``regrab_no_prior`` is REGRAB's head without a prior
(:mod:`model.methods.regrab`); the support-mean head of ``proto`` and ``mtb`` is
:class:`~model.methods.base.PrototypeHead`, which the untrained floor shares.

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.methods.base import PrototypeHead
from model.methods.registry import Method

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.prior.graph import RelationGraph


def _prototypes(config: RegrabConfig, graph: RelationGraph | None, dim: int
                ) -> PrototypeHead:
    return PrototypeHead(config.langevin.similarity, config.langevin.temperature,
                         config.langevin.prototype_scoring)


METHODS = (
    Method("mtb", _prototypes, "support-mean prototypes, dot product (Baldini Soares et al.)",
           similarity="dot", seed=2),
    Method("proto", _prototypes, "support-mean prototypes, Euclidean (Snell et al.)",
           similarity="euclidean", seed=3),
)
