"""Every few-shot method by name, and the interface their heads share.

A method is a :class:`Method`: a name, a builder for its head, and what it needs (the
relation graph, a similarity). The params schemas, the trainer, the checkpoint loader,
``evaluate``, ``regrab-score`` and the reports read this registry rather than lists of their
own. Adding a method is one module that defines ``METHODS = (Method(...), ...)`` plus one
line in :data:`MODULES` (README, "Add a method"); a test or plug-in may also call
:func:`register` directly.

A method's training seed is its own (:attr:`Method.seed_stream`), so adding, removing or
reordering methods, here or in ``params.yaml``, never changes another method's models.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.files.checkpoint import RegrabConfig
    from model.prior.gcn import GraphPrior, RelationGraph

#: The modules whose ``METHODS`` make up the registry, in registry order.
MODULES = (
    "model.methods.regrab",
    "model.methods.proto",
    "model.methods.proto_label",
    "model.methods.maml",
    "model.methods.versa",
    "model.methods.bmaml",
    "model.methods.gnn",
    "model.methods.snail",
    "model.methods.pair",
)


@runtime_checkable
class Head(Protocol):
    """What training, evaluation and prediction ask of a method's head.

    Shapes:
        support (B, N, K, D), query (B, Q, D), h (B, N, D) or None, rows (B, N).
    """

    #: The graph prior (None for methods without one).
    prior: GraphPrior | None
    #: Whether one way's prototype depends on other ways' support (then unequal K cannot be
    #: split into groups of equal K at prediction time).
    couples_ways: bool

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


@dataclass(frozen=True)
class Method:
    """One few-shot method.

    Attributes:
        name: the name in ``params.yaml`` (``train.methods``), metrics and model folders.
        build: ``(config, graph or None, D) -> head``.
        summary: one line for README tables and ``--help``.
        uses_graph: the head needs the relation graph (``stages.train --graph``).
        zero_shot: it can classify with no support sentences (K = 0).
        similarity: overrides ``model.langevin.similarity`` (None: keep it).
        seed: the method's own random stream for training (see :attr:`seed_stream`).
    """

    name: str
    build: Callable[[RegrabConfig, RelationGraph | None, int], Head]
    summary: str
    uses_graph: bool = False
    zero_shot: bool = False
    similarity: str | None = None
    seed: int | None = None

    @property
    def seed_stream(self) -> int:
        """The number that, with the split and setting, seeds this method's training.

        The built-in methods pin theirs (the streams they were trained with); a method that
        names none gets one from its name, so no method's seed depends on the others.
        """
        return self.seed if self.seed is not None else zlib.crc32(self.name.encode())


_REGISTRY: dict[str, Method] = {}
_loaded = False


def register(method: Method) -> Method:
    """Add ``method`` (a name already taken by another method is refused)."""
    old = _REGISTRY.get(method.name)
    if old is not None and old != method:
        raise ValueError(f"method {method.name!r} is registered twice")
    twin = next((m.name for m in _REGISTRY.values()
                 if m.name != method.name and m.seed_stream == method.seed_stream), None)
    if twin is not None:
        raise ValueError(f"method {method.name!r} has the seed stream of {twin!r}; give it "
                         "another seed")
    _REGISTRY[method.name] = method
    return method


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in MODULES:
            for method in importlib.import_module(module).METHODS:
                register(method)


def names() -> tuple[str, ...]:
    """Every registered method, in registry order."""
    _load()
    return tuple(_REGISTRY)


def get(name: str) -> Method:
    """The method called ``name``; an unknown name lists the known ones."""
    _load()
    if name not in _REGISTRY:
        raise PipelineError(f"unknown method {name!r}; use one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def check(names_: tuple[str, ...] | list[str], where: str) -> None:
    """Raise (as a params error) if any of ``names_`` is not a registered method."""
    _load()
    unknown = [n for n in names_ if n not in _REGISTRY]
    if unknown:
        raise ValueError(f"{where} has unknown method(s) {unknown}; use some of "
                         f"{list(_REGISTRY)}")
