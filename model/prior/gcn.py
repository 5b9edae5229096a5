"""Graph-based prior p(v_r | G) = N(v_r | h_r, I) with h_r = F(G)_r (paper Eq. 5-6).

F is a graph convolutional network (Kipf & Welling) over the global relation graph whose node
features are relation embeddings (TransE or the authors' own); its last layer projects to the
sentence-encoding size D so that h_r lives where prototypes live.

With ``text: true`` (our addition; the paper's prior reads the embeddings only) each node's
Wikidata label is read too, by the sentence encoder itself: the label becomes a template
sentence (:func:`~model.prior.labels.label_sentence`,
``[E1] subject [/E1] <label> [E2] object [/E2]``) and

    h_r = F(G)_r + g * (e_r - mean_r' e_r'),

with e_r that sentence's encoding and g a learned gain. The term lives in the encoding space
by construction, so it predicts an unseen relation's prototype from its name alone, which a
map from TransE fitted on a handful of training relations cannot (the empirical-Bayes lambda
of :mod:`model.posterior.langevin` measures how well it predicts). The training stage starts the
graph term at the mean training encoding (:meth:`GraphPrior.start_at`). The prior owns the
labels' whole life (:class:`~model.prior.labels.LabelText`): their template sentences, their
encodings with gradients during training (so the encoder learns to place sentences near their
relation's label), and the buffer they are refreshed into at every validation, which is saved
with the model for evaluation and prediction. The graph it reads is
:class:`~model.prior.graph.RelationGraph`.

Relations of a split that are missing from the graph get one shared, learned fallback vector
(the authors' code silently gave them a zero prior); how many there are is logged.

Shapes:
    R relations in the graph, F feature size, D encoding size, N ways.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from model.encoder.frozen_cache import LowerCache, encode_all
from model.encoder.sentence import SentenceEncoder
from model.prior.config import GraphPriorConfig
from model.prior.graph import RelationGraph
from model.prior.labels import LabelText, description_words, label_sentence
from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA

log = logging.getLogger(__name__)


class GraphPrior(nn.Module):
    """h = GCN(features, graph) projected to D, plus a learned fallback for unknown relations."""

    def __init__(self, config: GraphPriorConfig, graph: RelationGraph, out_dim: int) -> None:
        super().__init__()
        self.config = config
        self.relations = list(graph.relations)
        self._index = {r: i for i, r in enumerate(self.relations)}
        feats = graph.features
        if config.normalize_features:
            feats = feats / feats.norm(dim=1, keepdim=True).clamp(min=1e-8)
        # Buffers, so a checkpoint carries its graph and loads without the graph files (the
        # raw features are not saved: only A_hat X below is ever used).
        self.register_buffer("features", feats.clone(), persistent=False)
        edges, weights = graph.edge_index.clone(), graph.edge_weight.clone().clamp(min=0.0)
        if config.kind in ("mlp", "none"):  # no neighbours: A_hat = I, each relation on its own
            edges, weights = edges[:, :0], weights[:0]
        if config.kind == "none":  # no features either: the first layer is its bias alone
            feats = torch.zeros_like(feats)
        self.register_buffer("edge_index", edges)
        self.register_buffer("edge_weight", weights)
        # The first GCN layer is A_hat (X W) = (A_hat X) W and X is fixed, so A_hat X is
        # computed once; with one layer a step then only needs the episode's N rows.
        self.register_buffer("propagated", self._propagate(feats))
        dims = [feats.shape[1]] + [config.hidden] * (config.layers - 1) + [out_dim]
        # Imported here, not at the top: torch_geometric costs about 3 s of CPU to import, which
        # every process that only reads this module's names (a params check) would pay.
        from torch_geometric.nn import GCNConv

        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.scale = nn.Parameter(torch.tensor(float(config.scale)))
        self.fallback = nn.Parameter(torch.zeros(out_dim))
        # Label encodings (text: true): e_r - mean, 0 for unlabelled rows; saved with the model.
        self.labels = graph.labels
        self.descriptions = graph.descriptions if config.descriptions else None
        if config.text:
            self.text_gain = nn.Parameter(torch.tensor(1.0))
            self.register_buffer("text", torch.zeros(len(self.relations), out_dim))
            self.register_buffer("text_mean", torch.zeros(out_dim))
        if config.text and config.descriptions:
            # Which graph rows' label sentences read a description (saved, so a loaded model
            # can say what its prior read).
            said = [bool(d) and bool(lab) for d, lab in zip(
                self.descriptions or [None] * len(self.relations),
                self.labels or [None] * len(self.relations), strict=True)]
            self.register_buffer("described", torch.tensor(said, dtype=torch.bool))
        if config.mix == "heldout":
            # (graph weight, label weight) used outside training; (1, 1) is h_r as trained.
            self.register_buffer("mix", torch.ones(2))
        # Relations outside the graph named at prediction time (:meth:`add_names`): rows
        # R, R+1, ... whose prior is model.prior.named's graph term plus their name's label term.
        # Not saved.
        self.named: list[str] = []
        self.named_described: set[str] = set()
        self.register_buffer("named_text", torch.zeros(0, out_dim), persistent=False)

    def _propagate(self, x: torch.Tensor) -> torch.Tensor:
        """``A_hat x`` with GCNConv's normalisation (self-loops, symmetric degree scaling).

        Shapes:
            x: (R, F) -> (R, F)
        """
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        ei, w = gcn_norm(self.edge_index, self.edge_weight, num_nodes=x.shape[0],
                         add_self_loops=True)
        return torch.zeros_like(x).index_add_(0, ei[1], x[ei[0]] * w[:, None])

    def _first_layer(self, rows: torch.Tensor | None) -> torch.Tensor:
        conv = self.convs[0]
        x = self.propagated if rows is None else self.propagated[rows]
        out = conv.lin(x)
        return out + conv.bias if conv.bias is not None else out

    def coverage(self, relations: list[str], what: str = "split") -> list[str]:
        """The relations absent from the graph (they get the learned fallback prior), logged.

        A set whose relations are all absent (e.g. another domain's labels) still works: every
        way then shares the fallback, and REGRAB's posterior rests on the support alone.
        """
        missing = [r for r in relations if r not in self._index]
        if missing and len(missing) == len(relations):
            log.warning("none of the %d %s relations is in the relation graph (e.g. %s): all "
                        "get the learned fallback prior", len(relations), what, missing[0])
        elif missing:
            log.warning("%d of %d %s relations are not in the graph and get the learned "
                        "fallback prior: %s", len(missing), len(relations), what, missing)
        return missing

    def index(self, relations: list[str]) -> torch.Tensor:
        """Graph row of each relation, -1 for relations absent from the graph.

        A relation named with :meth:`add_names` gets its row after the graph's (R + j).
        """
        return torch.tensor([self._index.get(r, -1) for r in relations], dtype=torch.long)

    @torch.no_grad()
    def add_names(self, names: dict[str, str | None], encoder: SentenceEncoder,
                  cache: LowerCache | None = None, batch_size: int = 64,
                  descriptions: dict[str, str | None] | None = None) -> None:
        """Give relations outside the graph a prior read from their names.

        Each named relation absent from the graph gets the graph term's mean over the graph
        (``named: graph_mean``) or the shared fallback vector (``named: fallback``), plus the
        label term of its name, ``g (e_name - mean)``, exactly as a graph relation's label
        adds to its graph term; relations with no name (None) keep the fallback alone. Needs
        ``text: true`` (a graph-only prior reads no names); replaces earlier names. With
        ``descriptions: true`` a relation's entry in ``descriptions`` is read after its name.

        Shapes:
            named_text: (M, D) for the M relations named here
        """
        self.named = []
        self.named_text = self.named_text[:0]
        for r in list(self._index):
            if self._index[r] >= len(self.relations):
                del self._index[r]
        if not self.config.text:
            return
        new = [(r, n) for r, n in names.items() if n and r not in self._index]
        if not new:
            return
        said = (descriptions or {}) if self.config.descriptions else {}
        table = pa.Table.from_pylist([label_sentence(r, n, said.get(r)) for r, n in new],
                                     schema=FEWSHOT_SCHEMA)
        enc = encode_all(encoder, encoder.tokenize(table), cache, batch_size)  # (M, D)
        self.named = [r for r, _ in new]
        self.named_described = {r for r, _ in new if description_words(said.get(r))}
        self.named_text = (enc - self.text_mean).to(self.text.device)
        for j, r in enumerate(self.named):
            self._index[r] = len(self.relations) + j

    def prior_kind(self, relation: str) -> str:
        """Where ``relation``'s prior mean comes from: one of
        :data:`~model.prior.labels.PRIOR_KINDS`."""
        row = self._index.get(relation, -1)
        if row < 0:
            return "fallback"
        return "graph" if row < len(self.relations) else "label"

    def text_kind(self, relation: str) -> str:
        """What ``relation``'s prior read: one of :data:`~model.prior.labels.TEXT_KINDS`."""
        row = self._index.get(relation, -1)
        if row < 0 or not self.config.text:
            return "no text"
        if row >= len(self.relations):
            return "name+description" if relation in self.named_described else "name"
        if not bool(self.text[row].any()):
            return "no text"  # an unlabelled graph relation
        described = getattr(self, "described", None)
        return "name+description" if described is not None and bool(described[row]) else "name"

    def label_rows(self) -> tuple[list[int], pa.Table]:
        """The graph rows that have a label and their template sentences (FEWSHOT_SCHEMA)."""
        if self.labels is None:
            raise PipelineError(
                "model.prior.text needs the relations' labels: pass --relations "
                "data/wikidata/relations.parquet to the train stage, or set "
                "model.prior.text: false"
            )
        rows = [i for i, lab in enumerate(self.labels) if lab]
        said = self.descriptions or [None] * len(self.relations)
        table = pa.Table.from_pylist(
            [label_sentence(self.relations[i], self.labels[i], said[i]) for i in rows],
            schema=FEWSHOT_SCHEMA)
        return rows, table

    def read_labels(self, encoder: SentenceEncoder, cache: LowerCache | None,
                    batch_size: int) -> LabelText:
        """Tokenize the labels for ``encoder`` (filling its frozen-layer ``cache``) and encode
        them into the buffer once."""
        rows, table = self.label_rows()
        tokens = encoder.tokenize(table)
        if cache is not None:
            cache.states(encoder, tokens, np.arange(len(rows)), batch_size)
        sentence_of = torch.full((len(self.relations),), -1, dtype=torch.long)
        sentence_of[torch.as_tensor(rows)] = torch.arange(len(rows))
        text = LabelText(self, tokens, rows, sentence_of, cache, batch_size)
        text.refresh(encoder)
        return text

    @torch.no_grad()
    def start_at(self, mean: torch.Tensor) -> None:
        """Start the graph term at ``mean`` (the mean training encoding), the label term's
        gain at 1, by setting the last GCN layer's bias.

        (A gain fitted by least squares on the training relations' mean encodings did worse
        on the tuning relations: docs/results/findings.md#tuning-relations.)

        Shapes:
            mean: (D,)
        """
        self.convs[-1].bias.copy_(mean / self.scale)

    @torch.no_grad()
    def set_text(self, rows: list[int], encodings: torch.Tensor) -> None:
        """Store the label encodings of graph ``rows``, centred on their mean.

        Shapes:
            encodings: (len(rows), D)
        """
        mean = encodings.mean(0)
        self.text_mean.copy_(mean)
        self.text.zero_()
        self.text[torch.as_tensor(rows, device=self.text.device)] = encodings - mean

    def _text_term(self, rows: torch.Tensor, text: torch.Tensor | None) -> torch.Tensor:
        """``g (e_r - mean)``: from fresh encodings ``text`` if given (NaN rows: no label),
        else from the buffer.

        Shapes:
            rows: (...,), text: (..., D) or None -> (..., D)
        """
        if text is None:
            return self._label_gain() * self.text[rows]
        fresh = torch.nan_to_num(text - self.text_mean, nan=0.0)
        return self._label_gain() * fresh

    def _mixing(self) -> bool:
        """Whether the held-out mixing weights apply (``mix: heldout``, outside training)."""
        return self.config.mix == "heldout" and not self.training

    def _label_gain(self) -> torch.Tensor:
        """g, times the held-out label weight when :meth:`_mixing`."""
        return self.text_gain * self.mix[1] if self._mixing() else self.text_gain

    def _mixed(self, x: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
        """The graph term ``x`` pulled towards ``centre`` by the held-out graph weight."""
        return centre + self.mix[0] * (x - centre) if self._mixing() else x

    def _graph_states(self, rows: torch.Tensor | None) -> torch.Tensor:
        """The GCN term ``F(G) * scale`` for graph ``rows`` (None: every relation).

        With one layer only the rows asked for are computed (``A_hat X`` is precomputed).

        Shapes:
            rows: (...,) or None -> (..., D) or (R, D)
        """
        if len(self.convs) == 1 and not self._mixing():
            x = self._first_layer(None if rows is None else rows.reshape(-1))
            x = x if rows is None else x.reshape(*rows.shape, -1)
            return x * self.scale
        x = self._first_layer(None)
        for conv in self.convs[1:]:
            x = conv(torch.relu(x), self.edge_index, self.edge_weight)
        x = x * self.scale  # (R, D)
        x = self._mixed(x, x.mean(0))
        return x if rows is None else x[rows]

    def node_states(self) -> torch.Tensor:
        """GCN output (plus the label term) for every relation of the graph.

        Shapes:
            -> (R, D)
        """
        x = self._graph_states(None)
        if self.config.text:
            x = x + self._label_gain() * self.text
        if self.named:
            x = torch.cat([x, self._named_states()])  # (R + M, D)
        return x

    def _named_base(self) -> torch.Tensor:
        """The graph term of a named relation (``model.prior.named``): the graph term's mean
        over the graph, or the fallback vector.

        Shapes:
            -> (D,)
        """
        if self.config.named == "graph_mean":
            return self._graph_states(None).mean(0)
        return self.fallback

    def _named_states(self) -> torch.Tensor:
        """Prior means of the relations named by :meth:`add_names`: (M, D)."""
        return self._named_base() + self._label_gain() * self.named_text

    def forward(self, rows: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        """Prior means for graph rows (-1 = fallback).

        ``text`` (``text: true`` only): the rows' label encodings computed just now (with
        gradients, during training), NaN where a relation has no label; else the buffer's.

        Shapes:
            rows: (...,), text: (..., D) or None -> (..., D)
        """
        rows = rows.to(self.features.device)
        r = len(self.relations)
        safe = rows.clamp(min=0, max=r - 1)
        h = self._graph_states(safe)  # (..., D)
        if self.config.text:
            h = h + self._text_term(safe, text)
        unknown = (rows < 0)[..., None]
        h = torch.where(unknown, self.fallback.expand_as(h), h)
        if self.named:
            named = self._named_states()[(rows - r).clamp(min=0, max=len(self.named) - 1)]
            h = torch.where((rows >= r)[..., None], named, h)
        return h
