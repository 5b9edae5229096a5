import numpy as np
import pytest
import torch

from model.encoder import (
    MARKERS,
    EncoderConfig,
    LowerCache,
    SentenceEncoder,
    _keep_window,
    encode_all,
    encode_rows,
    resolve_encoder_path,
)
from pipeline.errors import PipelineError
from tests.model.tiny_regrab import tiny_encoder, toy_table


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("bert"))


def _encoder(tiny_dir, **kw):
    return SentenceEncoder.from_config(EncoderConfig(name=str(tiny_dir), **kw))


def test_missing_encoder_path_raises(tmp_path):
    with pytest.raises(PipelineError, match="does not exist"):
        resolve_encoder_path(str(tmp_path / "nope"))
    with pytest.raises(PipelineError, match="does not exist"):
        SentenceEncoder.from_config(EncoderConfig(name="./no/such/model"))
    assert resolve_encoder_path("bert-base-uncased") == "bert-base-uncased"


def test_markers_are_single_tokens_and_pooling_reads_them(tiny_dir):
    enc = _encoder(tiny_dir, train_layers=1)
    table = toy_table(["P1", "P2"], 3, seed=0)
    tok = enc.tokenize(table)
    ids = enc.tokenizer.convert_tokens_to_ids(list(MARKERS))
    for i in range(len(tok)):
        assert tok.ids[i][tok.head[i, 0]] == ids[0]
        assert tok.ids[i][tok.tail[i, 0]] == ids[2]
        assert tok.head[i, 1] == tok.head[i, 0] + 1  # span starts right after [E1]
    assert enc.out_dim == 2 * enc.hidden
    batch = tok.batch([0, 1, 2])
    assert batch["input_ids"].shape[1] == max(len(tok.ids[i]) for i in range(3))  # dynamic pad


def test_marker_init_from_tokens(tiny_dir):
    enc = _encoder(tiny_dir, marker_init="tokens")
    emb = enc.model.get_input_embeddings().weight
    e1 = enc.tokenizer.convert_tokens_to_ids("[E1]")
    bracket = enc.tokenizer.convert_tokens_to_ids("[")
    assert torch.equal(emb[e1], emb[bracket])


def test_truncation_keeps_markers(tiny_dir):
    enc = _encoder(tiny_dir, max_length=16)
    table = toy_table(["P1"], 1, seed=0).to_pylist()[0]
    table["tokens"] = [f"w{i % 30}" for i in range(60)]
    table.update(head_start=40, head_end=42, tail_start=5, tail_end=6)
    import pyarrow as pa

    from pipeline.schemas import FEWSHOT_SCHEMA

    tok = enc.tokenize(pa.Table.from_pylist([table], schema=FEWSHOT_SCHEMA))
    ids = tok.ids[0]
    assert len(ids) <= 16
    marker_ids = set(enc.tokenizer.convert_tokens_to_ids(list(MARKERS)))
    assert marker_ids <= set(ids.tolist())
    assert ids[tok.head[0, 0]] == enc.tokenizer.convert_tokens_to_ids("[E1]")
    assert ids[tok.tail[0, 0]] == enc.tokenizer.convert_tokens_to_ids("[E2]")


def test_keep_window_cases():
    assert _keep_window(10, [(2, 3)], 20).tolist() == list(range(10))
    w = _keep_window(100, [(40, 44), (50, 52)], 20)
    assert len(w) == 20 and w.min() <= 40 and w.max() >= 51
    w = _keep_window(100, [(5, 7), (90, 93)], 20)
    assert len(w) <= 20 and {5, 6, 90, 91, 92} <= set(w.tolist())


@pytest.mark.parametrize("pooling", ["markers", "entity_mean", "markers_mean"])
def test_split_forward_equals_full_model(tiny_dir, pooling):
    enc = _encoder(tiny_dir, train_layers=1, pooling=pooling).eval()
    tok = enc.tokenize(toy_table(["P1", "P2"], 4, seed=1))
    batch = tok.batch(np.arange(8))
    out = enc(batch)
    assert out.shape == (8, enc.out_dim)
    hidden = enc.model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).last_hidden_state
    assert torch.allclose(out, enc.pool(hidden, batch), atol=1e-5)
    # The cached path gives the same encodings, in the original order.
    cache = LowerCache()
    assert torch.allclose(encode_all(enc, tok, cache, batch_size=3), out, atol=1e-5)
    assert len(cache) == 8


def test_only_top_layers_train(tiny_dir):
    enc = _encoder(tiny_dir, train_layers=1).train()
    trainable = set(enc.trainable_state())
    assert trainable and all("encoder.layer.1." in k for k in trainable)
    tok = enc.tokenize(toy_table(["P1"], 4, seed=2))
    cache = LowerCache()
    encode_rows(enc, tok, np.arange(4), cache).sum().backward()
    assert all(p.grad is None for n, p in enc.named_parameters() if "layer.0." in n)
    assert any(p.grad is not None for n, p in enc.named_parameters() if "layer.1." in n)
    with pytest.raises(PipelineError, match="train_layers"):
        _encoder(tiny_dir, train_layers=5)


def test_frozen_top_kv_cache_matches_and_trains_queries(tiny_dir):
    enc = _encoder(tiny_dir, train_layers=1, freeze_top_kv=True)
    tok = enc.tokenize(toy_table(["P1", "P2"], 3, seed=3))
    enc.eval()
    cache = LowerCache()
    cached = encode_rows(enc, tok, np.arange(6), cache)
    assert torch.allclose(cached, enc(tok.batch(np.arange(6))), atol=1e-5)
    enc.train()
    encode_rows(enc, tok, np.arange(6), cache).sum().backward()
    top = enc.model.encoder.layer[1]
    assert top.attention.self.key.weight.grad is None
    assert top.attention.self.query.weight.grad is not None
    with pytest.raises(PipelineError, match="freeze_top_kv"):
        EncoderConfig(train_layers=2, freeze_top_kv=True)
