"""GCN prior settings (``params.yaml`` section ``model.prior``).

The schema alone, without the network: it imports neither torch nor PyG, so the params checks
(``check_params``, the flow's ``-S`` overrides) read it in a fraction of a second;
:mod:`model.prior.gcn` builds the prior from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config import field, register_section


@dataclass(frozen=True)
class GraphPriorConfig:
    """GCN prior settings (``params.yaml`` section ``model.prior``).

    Attributes:
        kind: ``gcn`` (paper Eq. 6) or ``mlp``: the same network on a graph without edges, i.e.
            a feed-forward network over each relation's own embedding (the paper's ablation);
            ``none``: no graph at all, the graph term is one learned vector (with ``text``, the
            label-only prior).
        layers: GCN layers (paper: 1; "more layers, only very marginal improvement").
        hidden: width of hidden GCN layers (only used when layers > 1).
        normalize_features: scale node features to unit norm first (TransE norms vary).
        scale: initial value of a learned output scale; h_r starts small so the untrained prior
            does not drown the support likelihood.
        text: add the encoding of each relation's label to h_r (see the module docstring);
            needs the labels (``stages.train --relations``).
        descriptions: with ``text``, the label sentence reads the relation's description too
            (:func:`~model.prior.labels.label_sentence`), where one is known.
        zero_shot_mean: zero-shot training episodes score queries against h_r itself rather
            than against samples of the prior (REGRAB).
        mix: ``fixed``: h_r as trained; ``heldout``: at evaluation the graph term's deviation
            from its mean and the label term are weighted by two numbers chosen on the split's
            validation relations (:func:`model.prior.mix.fit_mix`).
        named: what a relation outside the graph that is named at evaluation or prediction
            (:meth:`GraphPrior.add_names`) has in place of the graph term: ``graph_mean``, the
            graph term's mean over the graph, where every graph relation's prior sits;
            ``fallback``, the learned fallback vector, which only the training relations
            absent from the graph train (often none, so it stays near 0, far from every
            encoding).
    """

    kind: Literal["gcn", "mlp", "none"] = field(
        doc="gcn (paper Eq. 6); mlp: the same network on a graph without edges, a feed-forward "
            "network over each relation's own embedding (the paper's ablation); none: no graph, "
            "the graph term is one learned vector (with text: the label-only prior)")
    layers: int = field(ge=1, le=16, doc="GCN layers (paper: 1)")
    hidden: int = field(ge=1, le=8192,
                        doc="width of the hidden GCN layers (used when layers > 1)")
    normalize_features: bool = field(doc="scale node features to unit norm first (TransE norms "
                                         "vary)")
    scale: float = field(doc="initial value of a learned output scale; h_r starts small so that "
                             "the untrained prior does not drown the support likelihood")
    text: bool = field(doc="add the encoding of each relation's Wikidata label to h_r (needs the "
                           "labels: stages.train --relations)")
    descriptions: bool = field(doc="with text: the label sentence also reads the relation's "
                                   "description where one is known (Wikidata's, or one a user "
                                   "gives); false: names only")
    zero_shot_mean: bool = field(
        doc="zero-shot training episodes score their queries against h_r itself (the prior "
            "mean, as the zero-shot rule does at evaluation); false: against samples of "
            "N(h_r, I / lambda), whose noise swamps h_r while lambda is small")
    mix: Literal["fixed", "heldout"] = field(
        doc="fixed: h_r as trained; heldout: for the relations it did not train on, the prior "
            "weights the graph term's deviation from its mean and the label term by two numbers "
            "chosen at every validation on the split's validation relations (weights 0 and 1: "
            "the label encoding alone, as proto_label)")
    named: Literal["graph_mean", "fallback"] = field(
        doc="the graph term of a relation outside the graph named at evaluation or prediction "
            "(its prior reads its name): graph_mean, the graph term's mean over the graph, "
            "where graph relations' priors sit; fallback: the learned fallback vector, which "
            "only training relations absent from the graph train")


@register_section("build_graph")
@dataclass(frozen=True)
class BuildGraphParams:
    """``params.yaml`` section ``build_graph``: the relation graph's nodes and edges."""

    features: Literal["transe", "official"] = field(
        doc="node features of the relation graph: transe (our TransE on the Wikidata "
            "triples) or official (the paper's released embeddings)")
    k: int = field(ge=1, doc="nearest neighbours per relation (the graph's edges)")
