"""Cost of scoring S posterior samples per episode, and what the cheaper scorings save.

REGRAB's predictive at evaluation draws S prototype sets per episode from the Gaussian
posterior and scores every query against each. This times one evaluation batch (the draw, the
logits and the Monte Carlo average), with the logits computed two ways side by side: the
product broadcast over the samples (``similarity_logits(query[:, None], v)``, which copies the
queries once per sample) and ``prototype_logits`` (one matrix product per episode), for S = 10
(training) and S = 50 (``model.langevin.eval_samples``). It checks the two give the same
logits. A third column draws the logits in the span of the queries and the means
(``gaussian_sample_logits``, what evaluation does): the same law from other random numbers,
so it is checked against the others' predictive probabilities, not for equality. Random
encodings: the cost depends on shapes only.

Usage:
    python benchmarks/bench_sampling.py [--episodes 250] [--ways 10] [--queries 5]
        [--dim 768] [--samples 10 50] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from model.methods.base import mc_log_predictive
from model.posterior.logits import gaussian_sample_logits, prototype_logits, similarity_logits


def one_batch(mean: torch.Tensor, std: torch.Tensor, query: torch.Tensor, samples: int,
              scorer: str, generator: torch.Generator) -> torch.Tensor:
    """Draw ``samples`` prototype sets and return the predictive's log-probabilities."""
    if scorer == "projected":
        return mc_log_predictive(gaussian_sample_logits(query, mean, std, samples, "euclidean",
                                                        2.5, generator))
    b, n, d = mean.shape
    z = torch.randn((b, samples, n, d), generator=generator)
    v = torch.addcmul(mean[:, None].expand(-1, samples, -1, -1), std[:, None], z)
    if scorer == "broadcast":
        logits = similarity_logits(query[:, None], v, "euclidean", 2.5)
    else:
        logits = prototype_logits(query, v, "euclidean", 2.5)
    return mc_log_predictive(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=250, help="evaluate.batch_episodes")
    parser.add_argument("--ways", type=int, default=10)
    parser.add_argument("--queries", type=int, default=5, help="queries per way")
    parser.add_argument("--dim", type=int, default=768, help="encoding size (MiniLM: 768)")
    parser.add_argument("--samples", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    b, n, d = args.episodes, args.ways, args.dim
    mean = torch.randn(b, n, d, generator=g)
    std = torch.rand(b, n, 1, generator=g)
    query = torch.randn(b, n * args.queries, d, generator=g)
    print(f"{b} episodes of {n} ways x {args.queries} queries, D = {d}, "
          f"{torch.get_num_threads()} thread(s); seconds per batch, best of {args.repeat}")
    print(f"{'S':>4} {'broadcast':>10} {'one product':>12} {'projected':>10} "
          f"{'speed-up':>9} {'speed-up':>9}")
    for s in args.samples:
        took = {}
        out = {}
        for scorer in ("broadcast", "product", "projected"):
            best = float("inf")
            for _ in range(args.repeat):
                gen = torch.Generator().manual_seed(1)
                t0 = time.perf_counter()
                out[scorer] = one_batch(mean, std, query, s, scorer, gen)
                best = min(best, time.perf_counter() - t0)
            took[scorer] = best
        if not torch.allclose(out["broadcast"], out["product"], atol=1e-3):
            raise SystemExit("error: the two scorings disagree; this is a bug")
        gap = (out["projected"].exp() - out["product"].exp()).abs().mean().item()
        if gap > 0.05:
            raise SystemExit(f"error: the projected draw's predictive is {gap:.3f} away from "
                             "the full draw's; this is a bug")
        print(f"{s:>4} {took['broadcast']:>10.3f} {took['product']:>12.3f} "
              f"{took['projected']:>10.3f} {took['broadcast'] / took['product']:>8.1f}x "
              f"{took['broadcast'] / took['projected']:>8.1f}x")
    print("speed-ups: broadcast / one product, broadcast / projected")


if __name__ == "__main__":
    main()
