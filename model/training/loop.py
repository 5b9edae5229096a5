"""Episodic meta-training of one model on one split: resume, step, validate, save.

Loss = -log p(y_Q | x_Q, x_S, y_S, G) on N-way K-shot episodes from the training relations
(N and K drawn per step, zero-shot episodes for ``regrab`` with probability
``zero_shot_rate``), AdamW with linear warm-up and linear decay, validation on fixed
episodes of the validation relations, best model kept. ``state.safetensors`` (weights, optimizer,
scheduler and every RNG) is the resume point after a kill; a resumed run ends bit-identical
to one that was never stopped. At the end, the best model's uncertainty on the validation
relations is measured for ``regrab-predict`` to abstain by (:mod:`model.training.val_scores`).

Shapes: see :mod:`model` (B episodes, N ways, K shots, Q queries, D encoding size).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from model.config import RegrabConfig
from model.encoder.frozen_cache import LowerCache, encode_all
from model.encoder.tokens import TokenizedSet
from model.episodes import EpisodeSampler, Setting, episode_accuracy, gather_episodes
from model.files.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    Checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from model.methods import registry
from model.methods.base import FewShotModel
from model.prior.graph import RelationGraph
from model.prior.labels import LabelText
from model.prior.mix import fit_mix
from model.training import precision, val_noise, val_scores, wrong_priors
from model.training.config import TrainConfig
from model.training.state import Run, save_state
from pipeline.errors import PipelineError
from pipeline.io import read_parquet
from pipeline.schemas import FEWSHOT_SCHEMA

log = logging.getLogger(__name__)


class TokenCache:
    """Tokenised tables, keyed by file and tokenisation settings (tokenise once)."""

    def __init__(self) -> None:
        self._sets: dict[tuple, tuple[TokenizedSet, list[str]]] = {}

    def get(self, model: FewShotModel, path: Path) -> tuple[TokenizedSet, list[str]]:
        c = model.encoder.config
        key = (str(path), c.name, c.markers, c.max_length)
        if key not in self._sets:
            table = read_parquet(path, FEWSHOT_SCHEMA)
            if table.num_rows == 0:
                raise PipelineError(f"{path} has no sentences; rebuild the splits")
            self._sets[key] = (model.encoder.tokenize(table), table.column("relation").to_pylist())
        return self._sets[key]


@contextlib.contextmanager
def weights_for_use(run: Run) -> Iterator[None]:
    """The encoder as it is validated and saved: with ``train.wise_ft`` < 1 its trained
    weights mixed with the pre-trained ones (WiSE-FT), put back as they were afterwards."""
    if run.pretrained is None:
        yield
        return
    alpha = run.sched.wise_ft
    params = dict(run.model.encoder.named_parameters())
    trained = {n: params[n].detach().clone() for n in run.pretrained}
    with torch.no_grad():
        for n, w0 in run.pretrained.items():
            params[n].mul_(alpha).add_(w0, alpha=1 - alpha)
    try:
        yield
    finally:
        with torch.no_grad():
            for n, w in trained.items():
                params[n].copy_(w)


def lr_lambda(steps: int, warmup: float):
    """Linear warm-up over ``warmup`` of the steps, then linear decay to 0."""
    warm = max(1, int(round(steps * warmup)))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (steps - step) / max(1, steps - warm))

    return f


def make_optimizer(model: FewShotModel, sched: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with groups for the trained encoder layers, the head and the sampler's scales.

    The scales (log lambda, log sigma^2) get their own rate: at the head's rate they moved
    by a few percent in a CPU run and stayed where they were initialised.
    """
    enc = [p for p in model.encoder.parameters() if p.requires_grad]
    scales = [p for n, p in model.head.named_parameters()
              if p.requires_grad and n.startswith("sampler.log_")]
    head = [p for n, p in model.head.named_parameters()
            if p.requires_grad and not n.startswith("sampler.log_")]
    groups = [g for g in ({"params": enc, "lr": sched.lr_encoder},
                          {"params": head, "lr": sched.lr_head},
                          {"params": scales, "lr": sched.lr_scales, "weight_decay": 0.0})
              if g["params"]]
    if not groups:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.0}]
    return torch.optim.AdamW(groups, weight_decay=sched.weight_decay,
                             **precision.optimizer_options(p for g in groups for p in g["params"]))


def frozen_states(model: FewShotModel, split_dir: Path, sched: TrainConfig, tokens: TokenCache,
                  cache: LowerCache | None) -> LabelText | None:
    """Compute into ``cache`` what a run of ``model`` on ``split_dir`` reads from it: the
    frozen layers of the training and validation sentences (once per sentence, batched by
    length), then those of the relation labels if the model's prior reads them.

    Returns:
        The labels' text (:class:`model.prior.gcn.LabelText`), or None without a text prior.
    """
    if cache is not None:
        for part in ("train", "val"):
            tok, _ = tokens.get(model, split_dir / f"{part}.parquet")
            order = np.argsort([len(x) for x in tok.ids], kind="stable")
            cache.states(model.encoder, tok, order, sched.encode_batch, progress=True)
    if model.prior is not None and model.prior.config.text:
        return model.prior.read_labels(model.encoder, cache, sched.encode_batch)
    return None


def prepare(split_dir: Path, method: str, model_cfg: RegrabConfig, sched: TrainConfig,
            graph: RelationGraph | None, device: str, tokens: TokenCache,
            lower_cache: LowerCache, seed: int, seed_key: tuple[int, ...]) -> Run:
    """Build the model, samplers, optimizer and RNGs of a fresh run, checking the split."""
    seeds = np.random.SeedSequence([seed, *seed_key]).generate_state(3)
    torch.manual_seed(int(seeds[0]))
    model = registry.build_model(model_cfg, graph).to(device)
    train_tok, train_rel = tokens.get(model, split_dir / "train.parquet")
    val_tok, val_rel = tokens.get(model, split_dir / "val.parquet")
    train_s = EpisodeSampler(train_rel, f"{split_dir.name} training split")
    val_s = EpisodeSampler(val_rel, f"{split_dir.name} validation split")
    ways = [w for w in sched.ways if w <= len(train_s.relations)]
    if not ways:
        raise PipelineError(
            f"train.ways={list(sched.ways)} all exceed the {len(train_s.relations)} training "
            f"relations of {split_dir.name}; lower train.ways"
        )
    if len(ways) < len(sched.ways):
        log.info("%s/%s: train.ways %s skipped (%d training relations)", split_dir.name, method,
                 [w for w in sched.ways if w not in ways], len(train_s.relations))
    for w in ways:
        train_s.check(w, max(sched.shots), sched.queries)
    if min(sched.shots) == 0 and not registry.get(method).zero_shot:
        raise PipelineError(f"zero-shot training needs the graph prior; {method} has none")
    for name in sched.val_settings:
        s = Setting.parse(name)
        val_s.check(s.ways, s.shots, sched.queries)
    if model.prior is not None:
        model.prior.coverage(train_s.relations, f"{split_dir.name} training")
        model.prior.coverage(val_s.relations, f"{split_dir.name} validation")
    cache = lower_cache if model.encoder.split > 0 else None
    labels = frozen_states(model, split_dir, sched, tokens, cache)
    if labels is not None:
        # The graph term starts at the mean training encoding, the label term's gain at 1.
        model.prior.start_at(encode_all(model.encoder, train_tok, cache,
                                        sched.encode_batch).mean(0))
    optimizer = make_optimizer(model, sched)
    pretrained = None
    if sched.wise_ft < 1:
        pretrained = {n: p.detach().clone() for n, p in model.encoder.named_parameters()
                      if p.requires_grad}
    return Run(
        model=model, method=method, name=f"{split_dir.name}/{method}", sched=sched,
        train_tok=train_tok, val_tok=val_tok, train_s=train_s, val_s=val_s, ways=ways,
        train_rows=model.rows(train_s.relations).to(device), cache=cache, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(sched.steps,
                                                                          sched.warmup)),
        rng=np.random.default_rng(int(seeds[1])),
        noise=torch.Generator(device=device).manual_seed(int(seeds[2])),
        val_seed=int(seeds[1]), labels=labels, pretrained=pretrained,
    )


def train_step(run: Run) -> tuple[float, int, int]:
    """One episode: sample N and K, encode, loss, backward, optimizer step.

    Returns:
        The loss and the episode's N and K.
    """
    sched = run.sched
    n = int(run.rng.choice(run.ways))
    shots = [k for k in sched.shots if k > 0] or [0]
    k = int(run.rng.choice(shots))
    if registry.get(run.method).zero_shot and sched.zero_shot_rate > 0 and \
            run.rng.random() < sched.zero_shot_rate:
        k = 0
    ep = run.train_s.sample(run.rng, n, k, sched.queries, 1)
    rows = np.concatenate([ep.support.reshape(-1), ep.query.reshape(-1)])
    enc = precision.encode_episode(run.model.encoder, run.train_tok, rows, run.cache,
                                   sched.length_buckets, sched.precision)
    local = type(ep)(ep.relation, np.arange(n * k).reshape(1, n, k),
                     n * k + np.arange(n * sched.queries).reshape(1, n, sched.queries))
    support, query, labels = gather_episodes(enc, local)
    prior_rows = run.train_rows[torch.from_numpy(ep.relation)]  # (1, N)
    if k > 0 and sched.wrong_prior_rate > 0 and run.model.prior is not None and \
            run.rng.random() < sched.wrong_prior_rate:
        kind = wrong_priors.KINDS[int(run.rng.integers(len(wrong_priors.KINDS)))]
        prior_rows = wrong_priors.corrupt_rows(prior_rows, run.train_rows, kind, run.rng)
    if run.labels is not None:
        with precision.encoder_precision(run.model.encoder, sched.precision):
            text = run.labels.encodings(run.model.encoder, prior_rows)
        h = run.model.head.prior_means(None, prior_rows, None if text is None else text.float())
    else:
        h = run.model.head.prior_means(None, prior_rows)
    log_p = run.model.head.log_predictive(support, query, h, run.noise)  # (1, Q, N)
    loss = torch.nn.functional.nll_loss(log_p.reshape(-1, n), labels.reshape(-1))
    if sched.evidence_weight > 0:
        # Empirical Bayes on every labelled sentence of the episode, per dimension. The
        # encodings are held fixed: this term fits the prior (h, lambda, sigma^2) to the
        # data; pulling the encoder towards tight classes here hurt validation accuracy.
        x = torch.cat([support, query.reshape(1, n, sched.queries, -1)], 2).detach()
        evidence = run.model.head.evidence(x, h)
        if evidence is not None:  # methods without the closed form have no such term
            loss = loss - sched.evidence_weight * evidence.mean() / x.shape[-1]
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()}")
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), sched.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    return loss.item(), n, k


def validate(run: Run) -> float:
    """Mean accuracy (%) over ``val_settings`` on fixed episodes of the validation split.

    With ``scales: heldout`` REGRAB's lambda and sigma^2 are re-estimated on these relations
    first (after the prior's mixing weights with ``model.prior.mix: heldout``), and a prior
    that reads relation labels re-encodes them, so the model kept as best
    carries the prior it was validated with.
    """
    model, sched = run.model, run.sched
    model.eval()
    if run.labels is not None:
        run.labels.refresh(model.encoder)
    enc = encode_all(model.encoder, run.val_tok, run.cache, sched.encode_batch)
    rows = model.rows(run.val_s.relations)
    groups = [enc[torch.from_numpy(m).to(enc.device)] for m in run.val_s.members]
    if model.prior is not None:
        mix = fit_mix(model.prior, groups, rows.to(enc.device),
                      model.config.langevin.temperature)
        if mix is not None:
            log.info("%s: heldout prior weights graph %.2f, label %.2f", run.name, *mix)
    h = model.head.prior_means(model.head.prior_states(), rows.to(enc.device))
    fitted = model.head.fit_heldout(groups, h) if h is not None else None
    if fitted is not None:
        log.info("%s: heldout lambda %.3g, sigma^2 %.3g", run.name, *fitted)
    accs = []
    for i, name in enumerate(sched.val_settings):
        s = Setting.parse(name)
        if s.shots == 0 and model.prior is None:
            continue
        episodes = run.val_s.sample(
            np.random.default_rng([run.val_seed, i]), s.ways, s.shots, sched.queries,
            sched.val_episodes,
        )
        gen = torch.Generator(device=enc.device).manual_seed(run.val_seed + i)
        accs.append(episode_accuracy(model.head, enc, episodes, rows,
                                     generator=gen).mean() * 100)
    model.train()
    return float(np.mean(accs))


def train(run: Run, out_dir: Path, params: dict[str, Any], live: Any = None,
          on_step: Any = None) -> dict[str, Any]:
    """Train until ``sched.steps``, validating, checkpointing and logging curves.

    ``params`` is the run's fingerprint (:func:`model.training.config.fingerprint`), saved with
    every checkpoint. ``on_step(step)`` is a test hook (e.g. to simulate a kill).
    """
    sched = run.sched
    best_path, state_path = out_dir / MODEL_FILE, out_dir / STATE_FILE
    last_good = str(state_path) if state_path.exists() else "none"
    run.model.train()
    bar = tqdm(total=sched.steps, initial=run.step, desc=run.name, leave=False)
    t0 = time.perf_counter()
    while run.step < sched.steps:
        try:
            loss, n, k = train_step(run)
        except FloatingPointError as exc:
            raise PipelineError(
                f"{exc} at step {run.step} of {run.name}; last good checkpoint: {last_good}; "
                "lower train.lr_* or model.langevin.step_size and rerun"
            ) from None
        run.step += 1
        bar.update(1)
        run.history.append({"step": run.step, "loss": loss, "ways": n, "shots": k})
        if live is not None:
            live.log_metric("train/loss", loss)
        if run.step % sched.val_every == 0 or run.step == sched.steps:
            with weights_for_use(run):
                acc = validate(run)
                run.history[-1]["val_acc"] = acc
                if live is not None:
                    live.log_metric("val/acc", acc)
                if acc > run.best:
                    run.best = acc
                    # The relations it saw, so scoring on other data can flag overlaps.
                    seen = {"train": run.train_s.relations, "val": run.val_s.relations}
                    save_checkpoint(best_path, Checkpoint.of(
                        run.model, params=params, step=run.step, val_acc=acc, done=False,
                        relations=seen))
        if live is not None:
            live.next_step()
        if run.step % sched.checkpoint_every == 0 or run.step == sched.steps:
            save_state(run, state_path, params)
            last_good = str(state_path)
        if on_step is not None:
            on_step(run.step)
    bar.close()
    if live is not None:
        live.end()
    best = read_checkpoint(best_path)
    seconds = round(time.perf_counter() - t0, 1)
    return {"best_step": best.step, "seconds": seconds,
            "final_loss": float(np.mean([h["loss"] for h in run.history[-20:]])),
            # After the loop and with its own generators: the training is as without it.
            "val_scores": val_scores.measure(run, best),
            "support_noise": val_noise.measure(run, best)}
