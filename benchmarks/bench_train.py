"""Training throughput: one REGRAB step vs the raw encoder, dynamic vs fixed padding.

All figures are sentences per second on one 10-way 5-shot episode with 5 queries per way
(100 sentences) from a real split, measured in the same process:

* ``regrab step (cached)``: the default training step (frozen layers and top-layer keys /
  values cached per sentence; queries, feed-forward, GCN prior, Langevin sampler, loss,
  backward).
* ``encoder only (cached)``: the same encoder work with a trivial loss: the difference is
  the overhead of the prior and the sampler.
* ``... feed-forward on padding``: the default step with the top layer's output projection
  and feed-forward run on every pooled position, padding included (rows pad to the longest
  entity pair), instead of the real positions only.
* ``regrab step, no cache, dynamic padding`` / ``... padded to 128``: the encoder run end to
  end every step (what the authors' code did, with every sentence padded to 128).

With ``--device`` (auto, cpu, cuda) it measures instead the whole-encoder step of the GPU
presets (``--preset``, default params-gpu-mpnet.yaml, over params.yaml's ``model`` section;
``--encoder`` names the encoder folder), optimizer step included, side by side:

* ``encoder alone, bf16`` / ``encoder alone, fp32``: forward and backward of the encoder on
  the episode's 100 sentences with a trivial loss;
* ``regrab step, bf16, fused AdamW, b buckets``: the step as ``train.precision: bf16`` runs
  it (:mod:`model.training.precision`) with 1, 2 and 4 length buckets;
* ``regrab step, fp32 (old path)``: one batch, float32, the default AdamW.

Usage:
    python benchmarks/bench_train.py [--split data/splits/split_0] [--threads 1] [--repeats 5]
    python benchmarks/bench_train.py --device cuda [--encoder FOLDER] [--preset FILE ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from model.encoder import frozen_cache as encoder_cache
from model.encoder.frozen_cache import LowerCache, encode_rows
from model.episodes import EpisodeSampler, gather_episodes
from model.methods.registry import build_model, config_for_method
from model.prior.graph import RelationGraph
from model.training import precision
from pipeline.config import load_params, merged, select_device
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def _random_graph(relations: list[str], dim: int = 512, k: int = 10) -> RelationGraph:
    """A random 10-NN graph over 828 relations (the size of the paper's graph)."""
    rng = np.random.default_rng(0)
    rel = list(relations) + [f"X{i}" for i in range(828 - len(relations))]
    feats = torch.from_numpy(rng.normal(size=(len(rel), dim)).astype(np.float32))
    src = np.repeat(np.arange(len(rel)), k)
    dst = rng.integers(0, len(rel), size=len(src))
    ei = torch.from_numpy(np.stack([np.r_[src, dst], np.r_[dst, src]]))
    return RelationGraph(rel, feats, ei, torch.ones(ei.shape[1]))


_layer_at = encoder_cache.layer_at


def _padded_layer_at(*args, used=None, **kwargs):
    return _layer_at(*args, **kwargs)


def _timeit(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _loss(model, enc: torch.Tensor, local, prior_rows: torch.Tensor,
          encoder_only: bool) -> torch.Tensor:
    """REGRAB's episode loss on the encodings, or a trivial one (the encoder alone)."""
    if encoder_only:
        return enc.pow(2).mean()
    support, query, labels = gather_episodes(enc, local)
    h = model.head.prior_means(None, prior_rows)
    log_p = model.head.log_predictive(support, query, h)
    return torch.nn.functional.nll_loss(log_p.reshape(-1, log_p.shape[-1]), labels.reshape(-1))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def preset_figures(args: argparse.Namespace, table, relations: list[str], ep, rows) -> None:
    """The GPU presets' whole-encoder step in bf16 and fp32 (see the module's docstring)."""
    import yaml

    device = select_device(args.device, "--device")
    section = load_params("params.yaml", "model")
    for p in args.preset:
        section = merged(section, (yaml.safe_load(p.read_text()) or {}).get("model", {}))
    if args.encoder:
        section["encoder"]["name"] = args.encoder
    sampler = EpisodeSampler(relations)
    graph = _random_graph(sorted(set(relations)))
    n, n_sent = ep.support.shape[1], len(rows)
    local = type(ep)(ep.relation, np.arange(n * 5).reshape(1, n, 5),
                     n * 5 + np.arange(n * 5).reshape(1, n, 5))
    torch.manual_seed(0)
    model = build_model(config_for_method(section, "regrab"), graph).to(device)
    model.train()
    tokens = model.encoder.tokenize(table)
    prior_rows = model.rows(sampler.relations)[torch.from_numpy(ep.relation)].to(device)
    params = [p for p in model.parameters() if p.requires_grad]

    def step(mode: str, buckets: int, fused: bool, encoder_only: bool):
        opt = torch.optim.AdamW(params, lr=1e-6,
                                **(precision.optimizer_options(params) if fused else {}))

        def run():
            enc = precision.encode_episode(model.encoder, tokens, rows, None, buckets, mode)
            loss = _loss(model, enc, local, prior_rows, encoder_only)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            _sync(device)

        return run

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"{section['encoder']['name']}, train_layers {section['encoder']['train_layers']}, "
          f"{n_sent} sentences per step, {device} ({name}), optimizer step included",
          flush=True)
    results = {}
    for label, mode, buckets, fused, enc_only in [
        ("encoder alone, bf16", "bf16", 1, True, True),
        ("encoder alone, fp32", "fp32", 1, False, True),
        ("regrab step, bf16, fused AdamW, 1 bucket", "bf16", 1, True, False),
        ("regrab step, bf16, fused AdamW, 2 buckets", "bf16", 2, True, False),
        ("regrab step, bf16, fused AdamW, 4 buckets", "bf16", 4, True, False),
        ("regrab step, fp32 (old path)", "fp32", 1, False, False),
    ]:
        sec = _timeit(step(mode, buckets, fused, enc_only), args.repeats)
        results[label] = n_sent / sec
        print(f"{label:45s} {n_sent / sec:9.1f} sentences/s  ({sec * 1000:.0f} ms/step)",
              flush=True)
    best = max((v, k) for k, v in results.items() if k.startswith("regrab step, bf16"))
    print(f"best bf16 step ({best[1].split(', ')[-1]}) vs the old fp32 path: "
          f"{best[0] / results['regrab step, fp32 (old path)']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", type=Path, default=Path("data/splits/split_0"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None,
                        help="auto, cpu or cuda: the GPU presets' whole-encoder step instead")
    parser.add_argument("--encoder", default=None, help="with --device: the encoder folder")
    parser.add_argument("--preset", type=Path, action="append", default=[],
                        help="with --device: partial params file(s) (default "
                             "params-gpu-mpnet.yaml)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    table = read_parquet(args.split / "train.parquet", FEWSHOT_SCHEMA)
    relations = table.column("relation").to_pylist()
    graph = _random_graph(sorted(set(relations)))
    sampler = EpisodeSampler(relations)
    # The CPU table's step is 10-way; the presets' figures take what a small split has.
    ways = 10 if args.device is None else min(10, len(sampler.relations))
    ep = sampler.sample(np.random.default_rng(0), ways, 5, 5, 1)
    rows = np.concatenate([ep.support.ravel(), ep.query.ravel()])
    n_sent = len(rows)
    if args.device is not None:
        args.preset = args.preset or [Path("params-gpu-mpnet.yaml")]
        preset_figures(args, table, relations, ep, rows)
        return

    def step_fn(model, tokens, cache, pad_to=None):
        local = type(ep)(ep.relation, np.arange(50).reshape(1, 10, 5),
                         50 + np.arange(50).reshape(1, 10, 5))
        prior_rows = model.rows(sampler.relations)[torch.from_numpy(ep.relation)]

        def run(encoder_only=False):
            if pad_to is None:
                enc = encode_rows(model.encoder, tokens, rows, cache, batch_size=n_sent)
            else:
                batch = tokens.batch(rows)
                pad = pad_to - batch["input_ids"].shape[1]
                batch["input_ids"] = torch.nn.functional.pad(batch["input_ids"], (0, pad))
                batch["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"],
                                                                  (0, pad))
                enc = model.encoder(batch)
            loss = _loss(model, enc, local, prior_rows, encoder_only)
            model.zero_grad(set_to_none=True)
            loss.backward()

        return run

    results = {}
    for label, params, cached, pad_to, enc_only in [
        ("regrab step (cached, default)", {"freeze_top_kv": True}, True, None, False),
        ("encoder only (cached, default)", {"freeze_top_kv": True}, True, None, True),
        ("regrab step (cached), feed-forward on padding", {"freeze_top_kv": True}, True,
         "positions", False),
        ("regrab step, top layer cached below", {}, True, None, False),
        ("regrab step, no cache, dynamic padding", {}, False, None, False),
        ("regrab step, no cache, padded to 128", {}, False, 128, False),
    ]:
        # "positions": the top layer's output projection and feed-forward also run on the
        # padded pooled positions (as before they were packed).
        encoder_cache.layer_at = _padded_layer_at if pad_to == "positions" else _layer_at
        pad_to = None if pad_to == "positions" else pad_to
        torch.manual_seed(0)
        section = load_params("params.yaml", "model")
        section["encoder"].update({"train_layers": 1, "freeze_top_kv": False, **params})
        model = build_model(config_for_method(section, "regrab"), graph)
        model.train()
        tokens = model.encoder.tokenize(table)
        cache = LowerCache() if cached else None
        if cache is not None:
            cache.states(model.encoder, tokens, rows)
        run = step_fn(model, tokens, cache, pad_to)
        sec = _timeit(lambda run=run, e=enc_only: run(e), args.repeats)
        results[label] = n_sent / sec
        print(f"{label:45s} {n_sent / sec:9.1f} sentences/s  ({sec * 1000:.0f} ms/step)",
              flush=True)
    base = results["regrab step (cached, default)"]
    enc = results["encoder only (cached, default)"]
    print(f"prior + sampler overhead over the encoder alone: {100 * (enc / base - 1):.0f}% "
          f"of step time; dynamic vs fixed-128 padding: "
          f"{results['regrab step, no cache, dynamic padding'] / results['regrab step, no cache, padded to 128']:.1f}x; "  # noqa: E501
          f"cached vs uncached: {base / results['regrab step, no cache, dynamic padding']:.1f}x"
          f" (threads={torch.get_num_threads()})")


if __name__ == "__main__":
    main()
