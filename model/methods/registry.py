"""Every few-shot method by name, and building a method's config and model.

A method is a :class:`Method`: a name, a builder for its head (a
:class:`~model.methods.base.Head`), and what it needs (the relation graph, a similarity,
its head's sizes). The params schemas, the trainer, the checkpoint loader, ``evaluate``,
``regrab-score`` and the reports read this registry rather than lists of their own; models
are built here (:func:`config_for_method`, :func:`build_model`), so no config or checkpoint
code has to know a method. Adding a method is one module that defines
``METHODS = (Method(...), ...)`` plus one line in :data:`MODULES` naming the module and its
methods (docs/model.md#add-a-method); a test or plug-in may also call :func:`register` directly.
The params schemas only ask whether a name is a method (:func:`check`): that reads
:data:`MODULES` and imports no method, nor torch, so a bad ``-S`` override is refused at once.

A method's training seed is its own (:attr:`Method.seed_stream`), so adding, removing or
reordering methods, here or in ``params.yaml``, never changes another method's models.
"""

from __future__ import annotations

import dataclasses
import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from model.config import ModelParams, RegrabConfig
from pipeline.config import parse_section
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.methods.base import FewShotModel, Head
    from model.prior.graph import RelationGraph

#: The modules whose ``METHODS`` make up the registry, in registry order, each with the names
#: of the methods it defines (in its order; loading the registry checks that they agree).
MODULES = {
    "model.methods.regrab": ("regrab", "regrab_no_prior"),
    "model.methods.proto": ("mtb", "proto"),
    "model.methods.proto_label": ("proto_label",),
    "model.methods.maml": ("maml",),
    "model.methods.versa": ("versa",),
    "model.methods.bmaml": ("bmaml",),
    "model.methods.gnn": ("gnn",),
    "model.methods.snail": ("snail",),
    "model.methods.pair": ("pair",),
}


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
        sizes: the ``model.heads`` entry its head is built from, copied into its config
            (None: it reads none).
        stepwise: its head runs ``model.langevin.steps`` tensor updates per episode whatever
            the likelihood (SVGD), so each step costs what a softmax SGLD step does.
        samples: its head scores with several posterior samples of the prototypes, so the
            ``bald`` labelling strategy can rank by their disagreement (the params checks
            refuse ``bald`` for the others).
    """

    name: str
    build: Callable[[RegrabConfig, RelationGraph | None, int], Head]
    summary: str
    uses_graph: bool = False
    zero_shot: bool = False
    similarity: str | None = None
    seed: int | None = None
    sizes: Literal["gnn", "snail", "pair"] | None = None
    stepwise: bool = False
    samples: bool = False

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
        for module, declared in MODULES.items():
            methods = importlib.import_module(module).METHODS
            if tuple(m.name for m in methods) != declared:
                raise ValueError(f"{module} defines the methods {[m.name for m in methods]}, "
                                 f"but registry.MODULES names {list(declared)} for it; make "
                                 "them agree")
            for method in methods:
                register(method)


def _known() -> list[str]:
    """Every method's name in registry order, without importing a method module."""
    built_in = [name for declared in MODULES.values() for name in declared]
    return [*built_in, *(name for name in _REGISTRY if name not in built_in)]


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
    """Raise (as a params error) if any of ``names_`` is not a registered method, or one is
    named twice.

    Reads the names in :data:`MODULES` (and those registered since), so it imports no method.
    """
    known = _known()
    unknown = [n for n in names_ if n not in known]
    if unknown:
        raise ValueError(f"{where} has unknown method(s) {unknown}; use some of {known}")
    twice = sorted({n for n in names_ if list(names_).count(n) > 1})
    if twice:  # trained or scored twice, each run overwriting the other's outputs
        raise ValueError(f"{where} lists {', '.join(twice)} more than once; name each method "
                         "once")


def config_for_method(params: ModelParams | dict[str, Any], method: str) -> RegrabConfig:
    """The config of ``method`` from the ``model`` section (a dict is validated first).

    A method may fix the similarity (proto: Euclidean, mtb: dot product) and reads its own
    head's sizes, if any; everything else (temperature, encoder) comes from the same section.
    """
    if not isinstance(params, ModelParams):
        params = parse_section(ModelParams, params, "model")
    spec = get(method)
    langevin = params.langevin
    if spec.similarity is not None:
        langevin = dataclasses.replace(langevin, similarity=spec.similarity)
    config = RegrabConfig(method, params.encoder, params.prior, langevin)
    if spec.sizes is not None:
        config = dataclasses.replace(config, **{spec.sizes: getattr(params.heads, spec.sizes)})
    return config


def build_head(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> Head:
    """The head of ``config.method``; ``graph`` reaches only a method that uses it."""
    spec = get(config.method)
    if spec.sizes is not None and getattr(config, spec.sizes) is None:
        raise PipelineError(f"method {spec.name} is built from model.heads.{spec.sizes}; its "
                            "config has none")
    return spec.build(config, graph if spec.uses_graph else None, dim)


def build_model(config: RegrabConfig, graph: RelationGraph | None) -> FewShotModel:
    """Instantiate encoder and head for ``config.method`` (an unknown method is refused)."""
    from model.encoder.sentence import SentenceEncoder
    from model.methods.base import FewShotModel

    get(config.method)  # before the encoder is loaded
    encoder = SentenceEncoder.from_config(config.encoder)
    head = build_head(config, graph, encoder.out_dim)
    return FewShotModel(config, encoder, head)
