"""Graph-based prior p(v_r | G) = N(v_r | h_r, I) with h_r = F(G)_r (paper Eq. 5-6).

F is a graph convolutional network (Kipf & Welling) over the global relation graph whose node
features are relation embeddings (TransE or the authors' own); its last layer projects to the
sentence-encoding size D so that h_r lives where prototypes live.

With ``text: true`` (our addition; the paper's prior reads the embeddings only) each node's
Wikidata label is read too, by the sentence encoder itself: the label becomes a template
sentence (:func:`label_sentence`, ``[E1] subject [/E1] <label> [E2] object [/E2]``) and

    h_r = F(G)_r + g * (e_r - mean_r' e_r'),

with e_r that sentence's encoding and g a learned gain. The term lives in the encoding space
by construction, so it predicts an unseen relation's prototype from its name alone, which a
map from TransE fitted on a handful of training relations cannot (the empirical-Bayes lambda
of :mod:`model.posterior.langevin` measures how well it predicts). The training stage starts the
graph term at the mean training encoding (:meth:`GraphPrior.start_at`). The prior owns the
labels' whole life (:class:`LabelText`): their template sentences, their encodings with
gradients during training (so the encoder learns to place sentences near their relation's
label), and the buffer they are refreshed into at every validation, which is saved with the
model for evaluation and prediction.

Relations of a split that are missing from the graph get one shared, learned fallback vector
(the authors' code silently gave them a zero prior); how many there are is logged.

Shapes:
    R relations in the graph, F feature size, D encoding size, N ways.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from model.encoder.frozen_cache import LowerCache, encode_all, encode_rows
from model.encoder.sentence import SentenceEncoder, TokenizedSet
from pipeline.config import field
from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphPriorConfig:
    """GCN prior settings (``params.yaml`` section ``model.prior``).

    Attributes:
        kind: ``gcn`` (paper Eq. 6) or ``mlp``: the same network on a graph without edges, i.e.
            a feed-forward network over each relation's own embedding (the paper's ablation).
        layers: GCN layers (paper: 1; "more layers, only very marginal improvement").
        hidden: width of hidden GCN layers (only used when layers > 1).
        normalize_features: scale node features to unit norm first (TransE norms vary).
        scale: initial value of a learned output scale; h_r starts small so the untrained prior
            does not drown the support likelihood.
        text: add the encoding of each relation's label to h_r (see the module docstring);
            needs the labels (``stages.train --relations``).
    """

    kind: Literal["gcn", "mlp"]
    layers: int = field(ge=1)
    hidden: int = field(ge=1)
    normalize_features: bool
    scale: float
    text: bool


#: Words around a relation label in its template sentence; the markers go round the two ends.
LABEL_TEMPLATE = ("subject", "object")
#: Where a way's prior mean came from (counted in reports): the graph (with the relation's
#: label when the prior reads labels), the relation's name alone, or the shared fallback.
PRIOR_KINDS = ("graph", "label", "fallback")
#: A Wikidata property or item id, or a bare number: an identifier, not a name to read.
_PID = re.compile(r"^([PQ]?\d+)$")
#: SemEval-style argument order, ``Cause-Effect(e1,e2)``.
_ARG_ORDER = re.compile(r"\(\s*e[12]\s*,\s*e[12]\s*\)\s*$", re.I)


def relation_name(key: str) -> str | None:
    """A readable name from a relation key of a FewRel-format file, or None for an id.

    ``gene_found_in_organism`` -> ``gene found in organism``; ``Cause-Effect(e1,e2)`` ->
    ``cause effect`` (the argument order is not a word); ``P17`` or ``3`` -> None.
    """
    key = _ARG_ORDER.sub("", key.strip())
    if not key or _PID.match(key):
        return None
    words = re.sub(r"[_\-/.:]+", " ", key).split()
    return " ".join(words).lower() or None


def label_sentence(relation: str, label: str) -> dict:
    """A relation label as a FEWSHOT_SCHEMA row: ``subject <label words> object``.

    The encoder inserts its entity markers around ``subject`` (head) and ``object`` (tail)
    as in any sentence, so marker pooling reads the label between them.
    """
    words = [LABEL_TEMPLATE[0], *label.split(), LABEL_TEMPLATE[1]]
    return {"instance_id": f"label-{relation}", "relation": relation, "relation_name": label,
            "tokens": words, "head_start": 0, "head_end": 1, "tail_start": len(words) - 1,
            "tail_end": len(words), "head_id": None, "tail_id": None}


@dataclass
class LabelText:
    """The relation labels of a prior with ``text: true``, as the encoder reads them.

    Made by :meth:`GraphPrior.read_labels`; the trainer calls :meth:`refresh` before each
    validation and :meth:`encodings` in each step.

    Attributes:
        prior: the prior whose labels these are.
        tokens: one tokenized template sentence per labelled relation.
        rows: the graph row of each sentence.
        sentence_of: per graph row, its sentence (-1: no label).
        cache: the frozen-layer cache of the encoder (None when every layer trains).
        batch_size: sentences per encoder batch.
    """

    prior: GraphPrior
    tokens: TokenizedSet
    rows: list[int]
    sentence_of: torch.Tensor  # (R,)
    cache: LowerCache | None
    batch_size: int

    def refresh(self, encoder: SentenceEncoder) -> None:
        """Re-encode every label with the encoder as it is now, into the prior's buffer."""
        self.prior.set_text(self.rows, encode_all(encoder, self.tokens, self.cache,
                                                  self.batch_size))

    def encodings(self, encoder: SentenceEncoder, rows: torch.Tensor) -> torch.Tensor | None:
        """The label encodings of graph ``rows`` with gradients, NaN where there is no label
        (None when no row has one).

        Shapes:
            rows: (B, N) -> (B, N, D)
        """
        idx = torch.where(rows >= 0, self.sentence_of[rows.clamp(min=0).cpu()].to(rows.device),
                          -1)
        present = idx >= 0
        if not bool(present.any()):
            return None
        enc = encode_rows(encoder, self.tokens, idx[present].cpu().numpy(), self.cache,
                          batch_size=max(int(present.sum()), 1))
        out = torch.full((*rows.shape, enc.shape[-1]), float("nan"), device=enc.device,
                         dtype=enc.dtype)
        return out.index_put((present,), enc)


@dataclass
class RelationGraph:
    """Node features and edges of the relation graph, indexed by relation id."""

    relations: list[str]
    features: torch.Tensor  # (R, F)
    edge_index: torch.Tensor  # (2, E)
    edge_weight: torch.Tensor  # (E,)
    labels: list[str | None] | None = None  # per relation; None: no labels were given

    @classmethod
    def from_tables(cls, graph: pa.Table, features: pa.Table,
                    relations: pa.Table | None = None) -> RelationGraph:
        """Build from GRAPH_SCHEMA and embeddings_schema tables; edges to unknown nodes dropped.

        ``relations`` (RELATIONS_SCHEMA) gives each node its label; nodes it lacks get none.
        """
        rel = features.column("relation").to_pylist()
        if len(rel) == 0:
            raise PipelineError("relation feature table is empty; rebuild data/features")
        emb = features.column("embedding").combine_chunks()
        dim = emb.type.list_size
        values = emb.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        feats = torch.from_numpy(values.reshape(len(rel), dim).copy())
        if not torch.isfinite(feats).all():
            raise PipelineError("relation features contain NaN/inf; rebuild data/features")
        index = {r: i for i, r in enumerate(rel)}
        src = graph.column("src").to_pylist()
        dst = graph.column("dst").to_pylist()
        weight = graph.column("weight").to_numpy(zero_copy_only=False).astype(np.float32)
        pairs = enumerate(zip(src, dst, strict=True))
        keep = [i for i, (s, d) in pairs if s in index and d in index]
        dropped = len(src) - len(keep)
        if dropped:
            log.warning("graph: %d of %d edges touch relations without features; dropped",
                        dropped, len(src))
        edge_index = torch.tensor(
            [[index[src[i]] for i in keep], [index[dst[i]] for i in keep]], dtype=torch.long
        ).reshape(2, -1)
        labels = None
        if relations is not None:
            named = dict(zip(relations.column("relation").to_pylist(),
                             relations.column("label").to_pylist(), strict=True))
            labels = [(named.get(r) or "").strip() or None for r in rel]
            if not any(labels):
                raise PipelineError("the relations table labels none of the graph's relations; "
                                    "rebuild data/wikidata/relations.parquet")
        return cls(rel, feats, edge_index, torch.from_numpy(weight[keep].copy()), labels)


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
        if config.kind == "mlp":  # no neighbours: A_hat = I, each relation on its own
            edges, weights = edges[:, :0], weights[:0]
        self.register_buffer("edge_index", edges)
        self.register_buffer("edge_weight", weights)
        # The first GCN layer is A_hat (X W) = (A_hat X) W and X is fixed, so A_hat X is
        # computed once; with one layer a step then only needs the episode's N rows.
        self.register_buffer("propagated", self._propagate(feats))
        dims = [feats.shape[1]] + [config.hidden] * (config.layers - 1) + [out_dim]
        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.scale = nn.Parameter(torch.tensor(float(config.scale)))
        self.fallback = nn.Parameter(torch.zeros(out_dim))
        # Label encodings (text: true): e_r - mean, 0 for unlabelled rows; saved with the model.
        self.labels = graph.labels
        if config.text:
            self.text_gain = nn.Parameter(torch.tensor(1.0))
            self.register_buffer("text", torch.zeros(len(self.relations), out_dim))
            self.register_buffer("text_mean", torch.zeros(out_dim))
        # Relations outside the graph named at prediction time (:meth:`add_names`): rows
        # R, R+1, ... whose prior is the fallback plus their name's label term. Not saved.
        self.named: list[str] = []
        self.register_buffer("named_text", torch.zeros(0, out_dim), persistent=False)

    def _propagate(self, x: torch.Tensor) -> torch.Tensor:
        """``A_hat x`` with GCNConv's normalisation (self-loops, symmetric degree scaling).

        Shapes:
            x: (R, F) -> (R, F)
        """
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
                  cache: LowerCache | None = None, batch_size: int = 64) -> None:
        """Give relations outside the graph a prior read from their names.

        Each named relation absent from the graph gets the shared fallback vector plus the
        label term of its name, ``g (e_name - mean)``, exactly as a graph relation's label
        adds to its graph term; relations with no name (None) keep the fallback alone. Needs
        ``text: true`` (a graph-only prior reads no names); replaces earlier names.

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
        table = pa.Table.from_pylist([label_sentence(r, n) for r, n in new],
                                     schema=FEWSHOT_SCHEMA)
        enc = encode_all(encoder, encoder.tokenize(table), cache, batch_size)  # (M, D)
        self.named = [r for r, _ in new]
        self.named_text = (enc - self.text_mean).to(self.text.device)
        for j, r in enumerate(self.named):
            self._index[r] = len(self.relations) + j

    def prior_kind(self, relation: str) -> str:
        """Where ``relation``'s prior mean comes from: one of :data:`PRIOR_KINDS`."""
        row = self._index.get(relation, -1)
        if row < 0:
            return "fallback"
        return "graph" if row < len(self.relations) else "label"

    def label_rows(self) -> tuple[list[int], pa.Table]:
        """The graph rows that have a label and their template sentences (FEWSHOT_SCHEMA)."""
        if self.labels is None:
            raise PipelineError(
                "model.prior.text needs the relations' labels: pass --relations "
                "data/wikidata/relations.parquet to the train stage, or set "
                "model.prior.text: false"
            )
        rows = [i for i, lab in enumerate(self.labels) if lab]
        table = pa.Table.from_pylist(
            [label_sentence(self.relations[i], self.labels[i]) for i in rows],
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
        on the tuning relations: README, Findings.)

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
            return self.text_gain * self.text[rows]
        fresh = torch.nan_to_num(text - self.text_mean, nan=0.0)
        return self.text_gain * fresh

    def _graph_states(self, rows: torch.Tensor | None) -> torch.Tensor:
        """The GCN term ``F(G) * scale`` for graph ``rows`` (None: every relation).

        With one layer only the rows asked for are computed (``A_hat X`` is precomputed).

        Shapes:
            rows: (...,) or None -> (..., D) or (R, D)
        """
        if len(self.convs) == 1:
            x = self._first_layer(None if rows is None else rows.reshape(-1))
            x = x if rows is None else x.reshape(*rows.shape, -1)
            return x * self.scale
        x = self._first_layer(None)
        for conv in self.convs[1:]:
            x = conv(torch.relu(x), self.edge_index, self.edge_weight)
        x = x * self.scale  # (R, D)
        return x if rows is None else x[rows]

    def node_states(self) -> torch.Tensor:
        """GCN output (plus the label term) for every relation of the graph.

        Shapes:
            -> (R, D)
        """
        x = self._graph_states(None)
        if self.config.text:
            x = x + self.text_gain * self.text
        if self.named:
            x = torch.cat([x, self._named_states()])  # (R + M, D)
        return x

    def _named_states(self) -> torch.Tensor:
        """Prior means of the relations named by :meth:`add_names`: (M, D)."""
        return self.fallback + self.text_gain * self.named_text

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
