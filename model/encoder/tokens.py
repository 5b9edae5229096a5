"""Tokenisation with entity markers: a FEWSHOT_SCHEMA table to token ids, once per dataset.

A sentence becomes ``[CLS] ... [E1] head [/E1] ... [E2] tail [/E2] ... [SEP]`` (markers
inserted at word level; without markers the entity spans are found from the tokenizer's word
ids). A sentence longer than the encoder's ``max_length`` is cut around its entities
(:func:`_keep_window`), so the markers and the entity tokens always survive.
:class:`TokenizedSet` keeps the ids and pads the batches the encoder reads.

Shapes (letters as in :mod:`model`):
    B sentences of a batch, L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from pipeline.errors import PipelineError

#: Entity markers added to the vocabulary as special tokens, in this order.
MARKERS = ("[E1]", "[/E1]", "[E2]", "[/E2]")


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


def tokenize(tok, table: pa.Table, markers: bool, max_length: int) -> TokenizedSet:
    """Tokenise every sentence of a FEWSHOT_SCHEMA table once with tokenizer ``tok``.

    Markers (``markers``) are inserted at word level; sentences longer than ``max_length``
    are cut around the entities so that markers and entity tokens always survive.
    """
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
        if markers:
            inserts = sorted(
                [(hs, 0, "[E1]"), (he, 1, "[/E1]"), (ts, 0, "[E2]"), (te, 1, "[/E2]")],
                key=lambda x: (x[0], -x[1]),
            )
            for pos, _, mark in reversed(inserts):
                words.insert(pos, mark)
        words_all.append(words)
    enc = tok(words_all, is_split_into_words=True, add_special_tokens=False)
    special = {m: tok.convert_tokens_to_ids(m) for m in MARKERS} if markers else {}
    budget = max_length - 2
    ids_out, heads, tails = [], [], []
    for i, ids in enumerate(enc["input_ids"]):
        ids = np.asarray(ids, dtype=np.int64)
        if markers:
            pos = {m: int(np.flatnonzero(ids == special[m])[0]) for m in MARKERS}
            head = (pos["[E1]"], pos["[/E1]"] + 1)
            tail = (pos["[E2]"], pos["[/E2]"] + 1)
        else:
            word_ids = np.array([-1 if w is None else w for w in enc.word_ids(i)])
            head = _word_span(word_ids, cols["head_start"][i], cols["head_end"][i])
            tail = _word_span(word_ids, cols["tail_start"][i], cols["tail_end"][i])
        keep = _keep_window(len(ids), [head, tail], budget)
        ids = ids[keep]

        def remap(span: tuple[int, int], keep: np.ndarray = keep) -> tuple[int, int]:
            s = int(np.searchsorted(keep, span[0]))
            e = int(np.searchsorted(keep, span[1] - 1, side="right"))
            return s + 1, max(e, s + 1) + 1  # +1: [CLS] comes first

        h, t = remap(head), remap(tail)
        if markers:
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


def _word_span(word_ids: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """The token span of words ``start:end``, from the tokenizer's word id of each token."""
    inside = np.flatnonzero((word_ids >= start) & (word_ids < end))
    if len(inside) == 0:  # a word the tokenizer dropped (e.g. control characters)
        inside = np.flatnonzero(word_ids >= start)[:1]
        if len(inside) == 0:
            inside = np.array([len(word_ids) - 1])
    return int(inside[0]), int(inside[-1]) + 1
