"""model.training.precision: the fp32 one-batch step unchanged, buckets, bf16 autocast."""

import numpy as np
import pytest
import torch

from model.encoder.frozen_cache import LowerCache, encode_rows
from model.encoder.sentence import EncoderConfig, SentenceEncoder
from model.training import precision
from tests.model.tiny_regrab import tiny_encoder, toy_table


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("bert"))


def _encoder(tiny_dir, **kw) -> SentenceEncoder:
    base = dict(name=str(tiny_dir), pooling="markers_mean", markers=True, marker_init="tokens",
                train_layers=-1, max_length=128, dropout=0.0, freeze_top_kv=False,
                normalize=10.0, block_norm=True)
    torch.manual_seed(0)
    return SentenceEncoder.from_config(EncoderConfig(**{**base, **kw}))


def _tokens(enc):
    tok = enc.tokenize(toy_table(["P1", "P2", "P3"], 6, seed=0))
    assert len({len(x) for x in tok.ids}) > 3  # lengths differ, so buckets pad differently
    return tok


@pytest.mark.parametrize("kw", [{"train_layers": -1},
                                {"train_layers": 1, "freeze_top_kv": True}])
def test_one_fp32_bucket_is_the_old_call_bit_for_bit(tiny_dir, kw):
    enc = _encoder(tiny_dir, **kw)
    tok = _tokens(enc)
    rows = np.array([5, 1, 17, 3, 9, 12, 0])
    cache = LowerCache() if kw["train_layers"] >= 0 else None
    old = encode_rows(enc, tok, rows, cache, batch_size=len(rows))
    new = precision.encode_episode(enc, tok, rows, cache, 1, "fp32")
    assert torch.equal(old, new)


def test_buckets_keep_the_row_order_and_the_encodings(tiny_dir):
    enc = _encoder(tiny_dir).eval()
    tok = _tokens(enc)
    rows = np.array([5, 1, 17, 3, 9, 12, 0, 5])  # a row twice: encoded twice, as in one batch
    one = precision.encode_episode(enc, tok, rows, None, 1, "fp32")
    parts = precision.bucket_positions(tok, rows, 3)
    assert sorted(np.concatenate(parts)) == list(range(len(rows)))
    assert [len(p) for p in parts] == [3, 3, 2]
    longest = [max(len(tok.ids[rows[i]]) for i in p) for p in parts]
    assert longest == sorted(longest)  # sorted by length: the short ones pad less
    for b in (2, 3, len(rows) + 4):
        many = precision.encode_episode(enc, tok, rows, None, b, "fp32")
        torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-5)


def test_bf16_runs_the_encoder_in_bf16_and_keeps_fp32_weights(tiny_dir):
    enc = _encoder(tiny_dir)
    tok = _tokens(enc)
    rows = np.arange(10)
    ref = precision.encode_episode(enc, tok, rows, None, 1, "fp32")
    out = precision.encode_episode(enc, tok, rows, None, 2, "bf16")
    assert out.dtype == torch.float32 and out.requires_grad
    assert not torch.equal(out, ref)  # it did run in bf16
    torch.testing.assert_close(out, ref, rtol=0.05, atol=0.3)  # norm 10: bf16's 3 digits
    out.pow(2).sum().backward()
    grads = [p.grad for p in enc.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)
    assert all(p.dtype == torch.float32 for p in enc.parameters())
    with precision.encoder_precision(enc, "bf16"):
        assert torch.is_autocast_enabled("cpu")
    with precision.encoder_precision(enc, "fp32"):
        assert not torch.is_autocast_enabled("cpu")


def test_the_optimizer_is_fused_on_cuda_only():
    assert precision.optimizer_options([torch.nn.Parameter(torch.zeros(2))]) == {}
    assert precision.optimizer_options([]) == {}
    with pytest.raises(ValueError, match="fp32, bf16"):
        precision.autocast("cpu", "fp16")
