"""Sentence encoder: a BERT-family model with entity markers (paper appendix B).

A sentence ``x`` becomes ``[CLS] ... [E1] head [/E1] ... [E2] tail [/E2] ... [SEP]`` and its
encoding E(x) concatenates the hidden states at ``[E1]`` and ``[E2]`` (Baldini Soares et al.,
2019), so ``D = 2 H``. Two other poolings are kept for comparison: ``entity_mean`` (mean of
each entity span's token states, head then tail) and ``markers_mean`` (both, ``D = 4 H``).

Only the top ``train_layers`` transformer layers are trained; the embeddings and the layers
below them are frozen and kept in eval mode, so their output for a sentence never changes.
:mod:`model.encoder.frozen_cache` uses that to compute it once per sentence on CPUs; this
module is the plain encoder: settings, loading with the markers added, which layers train,
forward and pooling (:mod:`model.encoder.files` finds the weights,
:mod:`model.encoder.tokens` tokenises, :mod:`model.encoder.layers` knows the layer layouts).

Shapes (letters as in :mod:`model`):
    L tokens, H model hidden size, D sentence encoding.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import torch
from torch import nn

from model.encoder.config import EncoderConfig
from model.encoder.files import quiet_transformers, resolve_encoder_path
from model.encoder.layers import attention_projections, is_bert_layer, takes_position_bias
from model.encoder.tokens import MARKERS, TokenizedSet, tokenize
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

#: Existing tokens whose embeddings seed the markers (:data:`~model.encoder.tokens.MARKERS`,
#: ``marker_init: tokens``): brackets read as "start/end of a span" to a pre-trained model,
#: unlike a fresh random vector.
MARKER_SEEDS = (("[", "<"), ("]", ">"), ("{", "<"), ("}", ">"))


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
        """Tokenise every sentence of a FEWSHOT_SCHEMA table once (see
        :func:`model.encoder.tokens.tokenize`): markers when ``markers`` is on, cut to
        ``max_length`` around the entities."""
        return tokenize(self.tokenizer, table, self.config.markers, self.config.max_length)

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
