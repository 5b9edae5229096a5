import numpy as np
import pytest
import torch

from model.encoder.frozen_cache import FrozenStates, LowerCache, encode_all, encode_rows, lower
from model.encoder.sentence import EncoderConfig, SentenceEncoder, resolve_encoder_path
from model.encoder.tokens import MARKERS, _keep_window
from pipeline.errors import PipelineError
from tests.model.tiny_regrab import tiny_encoder, toy_table


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("bert"))


def _cfg(**kw) -> EncoderConfig:
    """A full config (dataclasses carry no defaults); these were the old defaults."""
    base = dict(name="minilm", pooling="markers", markers=True, marker_init="tokens",
                train_layers=2, max_length=128, dropout=0.1, freeze_top_kv=False, normalize=0.0,
                block_norm=False)
    return EncoderConfig(**{**base, **kw})


def _encoder(tiny_dir, **kw):
    return SentenceEncoder.from_config(_cfg(name=str(tiny_dir), **kw))


def test_missing_encoder_path_raises(tmp_path):
    with pytest.raises(PipelineError, match="does not exist"):
        resolve_encoder_path(str(tmp_path / "nope"))
    with pytest.raises(PipelineError, match="does not exist"):
        SentenceEncoder.from_config(_cfg(name="./no/such/model"))
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
        _cfg(train_layers=2, freeze_top_kv=True)


@pytest.mark.parametrize("pooling", ["markers", "entity_mean", "markers_mean"])
@pytest.mark.parametrize("kv", [False, True])
@pytest.mark.parametrize("block_norm", [False, True])
def test_cached_paths_equal_plain_forward_for_every_pooling(tiny_dir, pooling, kv, block_norm):
    """The top layer run only at the pooled tokens (and from cached keys/values) must give the
    whole model's encoding, including rows whose spans differ in length."""
    enc = _encoder(tiny_dir, train_layers=1, pooling=pooling, freeze_top_kv=kv,
                   block_norm=block_norm, normalize=3.0).eval()
    tok = enc.tokenize(toy_table(["P1", "P2", "P3"], 4, seed=5))
    lengths = {int(h[2] - h[1] + t[2] - t[1]) for h, t in zip(tok.head, tok.tail, strict=True)}
    assert len(lengths) > 1  # the padding of the span positions is exercised
    plain = enc(tok.batch(np.arange(12)))
    cache = LowerCache()
    assert torch.allclose(encode_rows(enc, tok, np.arange(12), cache, batch_size=5), plain,
                          atol=1e-5)
    assert torch.allclose(encode_rows(enc, tok, np.arange(12)[::-1], cache),
                          plain.flip(0), atol=1e-5)  # read back from the cache
    assert torch.allclose(encode_rows(enc, tok, np.arange(12), None), plain, atol=1e-5)
    if block_norm:
        blocks = plain.reshape(12, -1, enc.hidden).norm(dim=-1)  # every block the same length
        assert torch.allclose(blocks, blocks[:, :1].expand_as(blocks), atol=1e-4)


def test_kv_cache_keeps_pooling_apart(tiny_dir):
    """Two kv-cached encoders that read different tokens never share cache entries."""
    tok_rows = toy_table(["P1"], 3, seed=6)
    cache = LowerCache()
    for pooling in ("markers", "markers_mean"):
        enc = _encoder(tiny_dir, train_layers=1, pooling=pooling, freeze_top_kv=True).eval()
        tok = enc.tokenize(tok_rows)
        assert torch.allclose(encode_rows(enc, tok, np.arange(3), cache),
                              enc(tok.batch(np.arange(3))), atol=1e-5)
    assert len(cache) == 6


def test_cache_stores_one_type(tiny_dir):
    for kw in ({"train_layers": 1}, {"train_layers": 1, "freeze_top_kv": True}):
        enc = _encoder(tiny_dir, **kw).eval()
        tok = enc.tokenize(toy_table(["P1"], 3, seed=4))
        states = LowerCache().states(enc, tok, np.arange(3))
        assert all(isinstance(s, FrozenStates) for s in states)
        n = len(tok.ids[0])
        if enc.kv_cached:
            assert states[0].hidden.shape == (2, enc.hidden)
            assert states[0].kv.shape == (n, 2 * enc.hidden)
        else:
            assert states[0].hidden.shape == (n, enc.hidden) and states[0].kv is None


def test_frozen_part_stays_in_eval_mode(tiny_dir):
    enc = _encoder(tiny_dir, train_layers=1).train()
    assert not enc.model.embeddings.training and not enc.model.encoder.layer[0].training
    assert enc.model.encoder.layer[1].training
    # train_layers = all layers: the embeddings are still frozen, so still in eval mode
    enc = _encoder(tiny_dir, train_layers=2).train()
    assert not enc.model.embeddings.training and enc.model.encoder.layer[0].training
    enc = _encoder(tiny_dir, train_layers=-1).train()
    assert all(m.training for m in enc.model.modules())


def test_packaged_encoder_missing_names_its_make_target(monkeypatch, tmp_path):
    import model.encoder.files as encoder_module

    monkeypatch.setattr(encoder_module, "packaged_encoders_dir", lambda: tmp_path)
    with pytest.raises(PipelineError, match="make encoder-mpnet"):
        resolve_encoder_path("mpnet")
    (tmp_path / "all-mpnet-base-v2").mkdir()
    (tmp_path / "all-mpnet-base-v2" / "config.json").write_text("{}")
    assert resolve_encoder_path("mpnet") == str(tmp_path / "all-mpnet-base-v2")


def _with_pooler(folder):
    """The tiny BERT saved with a pooler, as every pre-trained BERT checkpoint is."""
    import torch
    from transformers import BertConfig, BertModel

    tiny_encoder(folder)
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(folder), add_pooling_layer=True).save_pretrained(folder)
    return folder


def test_loading_prints_no_load_report(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    folder = _with_pooler(tmp_path / "bert")
    verbosity = hf_logging.get_verbosity()
    capfd.readouterr()
    enc = SentenceEncoder.from_config(_cfg(name=str(folder), train_layers=1))
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "pooler" not in err and "Loading weights" not in err
    assert "pooler.dense.weight" not in enc.model.state_dict()
    assert hf_logging.get_verbosity() == verbosity  # restored for everyone else


def test_missing_weights_are_still_reported(tmp_path, caplog):
    import json

    folder = tiny_encoder(tmp_path / "bert")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3  # the checkpoint holds 2 layers: layer 2 is missing
    (folder / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="model.encoder.sentence"):
        SentenceEncoder.from_config(_cfg(name=str(folder), train_layers=1))
    assert "weights missing" in caplog.text and "encoder.layer.2." in caplog.text


def _tiny_mpnet(folder):
    """A random 2-layer MPNet (relative position bias shared by all layers)."""
    import torch
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    from tests.model.tiny_regrab import SPECIAL, WORDS

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<mask>"] + SPECIAL + WORDS)}
    MPNetTokenizer(vocab=vocab, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    config = MPNetConfig(vocab_size=4 + len(SPECIAL) + len(WORDS), hidden_size=32,
                         num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=130, pad_token_id=1)
    MPNetModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def test_mpnet_frozen_or_whole_equals_plain_forward(tmp_path):
    folder = _tiny_mpnet(tmp_path / "mpnet")
    enc = _encoder(folder, train_layers=0).eval()
    tok = enc.tokenize(toy_table(["P1", "P2"], 3, seed=5))
    out = enc(tok.batch(np.arange(6)))
    assert torch.allclose(encode_all(enc, tok, LowerCache(), batch_size=4), out, atol=1e-5)
    assert torch.allclose(encode_rows(enc, tok, np.arange(6), None), out, atol=1e-5)
    _encoder(folder, train_layers=-1)


@pytest.mark.parametrize("train_layers,kv", [(1, False), (1, True), (2, False)])
@pytest.mark.parametrize("pooling", ["markers", "markers_mean"])
def test_mpnet_top_layers_run_apart_with_position_bias(tmp_path, train_layers, kv, pooling):
    """MPNet's layers take the relative position bias of their model: run one by one, at the
    pooled tokens only, or from cached keys/values, they must give the model's encoding."""
    folder = _tiny_mpnet(tmp_path / "mpnet")
    enc = _encoder(folder, train_layers=train_layers, freeze_top_kv=kv, pooling=pooling).eval()
    assert enc.kv_cached is kv
    tok = enc.tokenize(toy_table(["P1", "P2", "P3"], 4, seed=5))
    batch = tok.batch(np.arange(12))
    hidden = enc.model(input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"]).last_hidden_state
    plain = enc.pool(hidden, batch)
    assert torch.allclose(enc(batch), plain, atol=1e-5)
    cache = LowerCache()
    assert torch.allclose(encode_rows(enc, tok, np.arange(12), cache, batch_size=5), plain,
                          atol=1e-5)
    assert torch.allclose(encode_rows(enc, tok, np.arange(12)[::-1], cache), plain.flip(0),
                          atol=1e-5)  # read back from the cache
    assert torch.allclose(encode_rows(enc, tok, np.arange(12), None), plain, atol=1e-5)
    # Only the top layers get gradients (and not the frozen keys/values with kv caching).
    enc.train()
    encode_rows(enc, tok, np.arange(12), cache).sum().backward()
    top = enc.model.encoder.layer[-1].attention.attn
    assert top.q.weight.grad is not None
    assert (top.k.weight.grad is None) is kv
    frozen = enc.model.encoder.layer[0] if train_layers == 1 else enc.model.embeddings
    assert all(p.grad is None for p in frozen.parameters())


def test_layers_without_a_known_layout_freeze_whole_or_train_whole(tmp_path, monkeypatch):
    """A model whose layers neither run alone (BERT) nor take a position bias (MPNet)."""
    import model.encoder.frozen_cache
    import model.encoder.layers
    import model.encoder.sentence

    folder = _tiny_mpnet(tmp_path / "mpnet")
    for module in (model.encoder.sentence, model.encoder.frozen_cache,
                   model.encoder.layers):  # layout not recognised
        monkeypatch.setattr(module, "takes_position_bias", lambda _: False)
    enc = _encoder(folder, train_layers=0).eval()
    tok = enc.tokenize(toy_table(["P1", "P2"], 3, seed=1))
    batch = tok.batch(np.arange(6))
    assert torch.allclose(lower(enc, batch), enc.model(**{k: batch[k] for k in (
        "input_ids", "attention_mask")}).last_hidden_state)  # the model's own forward
    assert torch.allclose(encode_all(enc, tok, LowerCache(), batch_size=4), enc(batch),
                          atol=1e-5)
    with pytest.raises(PipelineError, match="train_layers to 0"):
        _encoder(folder, train_layers=1)


def test_checkpoint_configs_from_before_block_norm_still_load():
    from model.config import RegrabConfig
    from tests.conftest import model_config

    old = model_config("regrab").to_dict()
    del old["encoder"]["block_norm"]
    assert RegrabConfig.from_dict(old).encoder.block_norm is False
