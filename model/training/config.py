"""``params.yaml`` section ``train``, and the fingerprint that decides whether to retrain.

A finished model is reused, and a killed run resumed, only when its fingerprint is the same:
the method's model config, the settings of this section that change what is learned, and
the digests of the data it learns from. Settings that only say where, how fast or which
models to train (``threads``, ``workers``, ``methods``, ``splits``, ``checkpoint_every``,
``dvclive``) are left out, and the typed values are compared, so ``2e-4`` and ``2.0e-4`` are
the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from model.config import RegrabConfig
from model.episodes import Setting
from model.methods import registry
from pipeline.config import (
    DEVICE_FIELD,
    field,
    load_benchmarks,
    load_params,
    load_section,
    parse_section,
    register_section,
)
from pipeline.errors import PipelineError

#: ``train`` settings that do not change the trained model (left out of the fingerprint).
NOT_IN_FINGERPRINT = ("methods", "splits", "per_setting", "checkpoint_every", "dvclive",
                      "threads", "workers")


@register_section("train")
@dataclass(frozen=True)
class TrainConfig:
    """``params.yaml`` section ``train`` (read by stages/train.py).

    Attributes:
        methods: methods to train (names of :mod:`model.methods.registry`).
        splits: which split folders to use (empty: every ``split_*`` found).
        per_setting: the paper's protocol: one model per listed setting (e.g. ``[5w1s,
            5w5s]``) in ``{method}/{setting}/``, trained on that N and K only (K = 0:
            regrab only). Empty: one model per method on mixed N and K.
        steps: optimisation steps (one episode each) per split and method.
        ways: N drawn uniformly per step (values above the training relations are dropped).
        shots: K drawn uniformly per step (one model covers every K).
        zero_shot_rate: probability of a K=0 episode for regrab (trains the prior directly).
        wrong_prior_rate: probability that an episode with shots has its ways' priors
            corrupted (:mod:`model.training.wrong_priors`), for methods with a prior.
        queries: Q/N queries per way.
        lr_encoder: AdamW learning rate of the trained encoder layers.
        lr_head: AdamW learning rate of the head (GCN prior, fallback vector).
        lr_scales: AdamW learning rate of REGRAB's log lambda and log sigma^2 (no decay).
        weight_decay: AdamW weight decay.
        warmup: fraction of steps with linear warm-up, then linear decay to 0.
        max_grad_norm: gradient clipping.
        val_every: validate (and keep the best model) every this many steps and at the end.
        val_episodes: episodes per validation setting (fixed, seeded).
        val_settings: validation settings on the validation relations.
        checkpoint_every: write ``state.safetensors`` (resume point) every this many steps.
        seed: seed of episodes, initialisation, dropout and Langevin noise.
        device: auto | cpu | cuda.
        encode_batch: sentences per batch when encoding a whole split.
        dvclive: log curves with dvclive under ``{out}/split_i/{method}/dvclive``.
        evidence_weight: weight of REGRAB's empirical-Bayes term, minus the log marginal
            likelihood of the episode's labelled sentences per dimension (gaussian
            likelihood only; see :func:`model.posterior.target.log_evidence`); 0 turns it off.
        threads: torch intra-op threads (0 = torch default). On our shared 2-core machine
            two OpenMP threads made every small op wait for a busy core: a cached-encoding
            step took 0.95 s with 2 threads and 0.06 s with 1 (benchmarks/bench_train.py).
        workers: models trained at once, one process each with ``threads`` threads (forked
            after the frozen layers are encoded, Linux and macOS). The models are the same
            whatever the number: each starts from the same cache and its own seeds.
        wise_ft: weight of the trained encoder in the model that is validated and saved,
            the rest being the pre-trained weights (WiSE-FT, Wortsman et al., 2022); training
            itself goes on from the unmixed weights. 1 keeps the trained encoder as it is.
        precision: ``fp32``, or ``bf16``: the encoder's passes of a training step under
            bfloat16 autocast, float32 weights and optimizer (:mod:`model.training.precision`).
        length_buckets: a training episode's sentences are encoded in this many batches of
            similar length, each padded to its own longest (1: one batch).
    """

    methods: tuple[str, ...] = field(doc="methods to train (names in model/methods/registry.py); "
                                         "the paper's other methods train in the comparison "
                                         "section")
    splits: tuple[str, ...] = field(doc="split folders to train on (empty: every split_* found)")
    per_setting: tuple[str, ...] = field(doc="the paper's protocol: one model per listed setting "
                                             "(e.g. [5w1s, 5w5s]) in {method}/{setting}/, trained "
                                             "on that N and K only (K = 0: regrab only); empty: "
                                             "one model per method on mixed N and K")
    steps: int = field(ge=1, doc="optimisation steps (one episode each) per split and method")
    ways: tuple[int, ...] = field(ge=2, doc="N of each step's episode, drawn uniformly; values "
                                            "above a benchmark's training relations are skipped")
    shots: tuple[int, ...] = field(ge=0, doc="K of each step's episode, drawn uniformly (one "
                                             "model covers every K)")
    zero_shot_rate: float = field(ge=0, le=1, doc="probability of a K = 0 episode for regrab (it "
                                                  "trains the prior directly)")
    wrong_prior_rate: float = field(ge=0, le=1, doc="probability that an episode with shots "
                                                    "reads wrong relations' priors (shuffled "
                                                    "among its ways, another relation's, or "
                                                    "none), for methods with a prior; its "
                                                    "labels stay right")
    queries: int = field(ge=1, doc="queries per way (Q/N) of each training episode")
    lr_encoder: float = field(ge=0, doc="AdamW learning rate of the trained encoder layers")
    lr_head: float = field(ge=0, doc="AdamW learning rate of the head (GCN prior, fallback "
                                     "vector)")
    lr_scales: float = field(ge=0, doc="AdamW learning rate of REGRAB's learned log lambda and "
                                       "log sigma^2 (no decay)")
    weight_decay: float = field(ge=0, doc="AdamW weight decay")
    warmup: float = field(ge=0, le=1, doc="fraction of steps with a linear warm-up, then a linear "
                                          "decay to 0")
    max_grad_norm: float = field(gt=0, doc="gradients are clipped to this norm")
    val_every: int = field(ge=1, doc="validate (and keep the best model) every this many steps "
                                     "and at the end")
    val_episodes: int = field(ge=1, doc="episodes per validation setting (fixed, seeded)")
    val_settings: tuple[str, ...] = field(doc="settings ({N}w{K}s) validated on the validation "
                                              "relations")
    checkpoint_every: int = field(ge=1, doc="write state.safetensors (the resume point) every "
                                            "this many steps")
    seed: int = field(doc="seed of episodes, initialisation, dropout and Langevin noise")
    device: str = field(match=DEVICE_FIELD, doc="auto (CUDA when present), cpu, cuda or cuda:N")
    encode_batch: int = field(ge=1, doc="sentences per batch when encoding a whole split")
    dvclive: bool = field(doc="log training curves with dvclive under "
                              "{out}/split_i/{method}/dvclive")
    evidence_weight: float = field(ge=0, doc="weight of REGRAB's empirical-Bayes term (minus the "
                                             "log marginal likelihood of the episode's labelled "
                                             "sentences per dimension; gaussian likelihood only); "
                                             "0 turns it off")
    threads: int = field(ge=0, doc="torch intra-op threads per process (0 = torch's default); 1 "
                                   "beat 2 on a shared 2-core machine")
    workers: int = field(ge=1, doc="models trained at once, one process each with `threads` "
                                   "threads; the models are the same whatever the number")
    wise_ft: float = field(gt=0, le=1, doc="weight of the trained encoder in the model that is "
                                           "validated and saved, the rest being the pre-trained "
                                           "weights (WiSE-FT); 1 keeps the trained encoder as it "
                                           "is")
    precision: Literal["fp32", "bf16"] = field(
        doc="fp32, or bf16: the encoder's forward and backward in a training step under "
            "bfloat16 autocast, weights and optimizer kept in float32 (for CUDA GPUs; AdamW is "
            "fused there either way)")
    length_buckets: int = field(ge=1, doc="a training episode's sentences are encoded in this "
                                          "many batches of similar length, each padded to its "
                                          "own longest (1: one batch, padded to the episode's "
                                          "longest sentence)")

    def __post_init__(self) -> None:
        for s in (*self.val_settings, *self.per_setting):
            Setting.parse(s)
        if not self.methods or not self.ways or not self.shots:
            raise ValueError("train.methods, train.ways and train.shots must not be empty")
        registry.check(self.methods, "train.methods")

    def schedule(self, setting: Setting | None) -> TrainConfig:
        """The config of one run; with ``setting`` only that N-way K-shot (paper protocol)."""
        if setting is None:
            return self
        return dataclasses.replace(self, ways=(setting.ways,), shots=(setting.shots,),
                                   zero_shot_rate=1.0 if setting.shots == 0 else 0.0)


def fingerprint(model_config: RegrabConfig, sched: TrainConfig, inputs: dict[str, str]
                ) -> dict[str, Any]:
    """What a trained model depends on: compared on resume and before retraining.

    Args:
        model_config: the method's :class:`model.config.RegrabConfig`.
        sched: this run's schedule (:meth:`TrainConfig.schedule`: one setting's N and K
            under the paper's protocol).
        inputs: digests of the files it learns from (graph, features, labels, split).
    """
    train = {k: v for k, v in dataclasses.asdict(sched).items() if k not in NOT_IN_FINGERPRINT}
    return {"model": model_config.to_dict(), "train": train, "inputs": dict(sorted(inputs.items()))}


@register_section("comparison")
@dataclass(frozen=True)
class ComparisonConfig:
    """``params.yaml`` section ``comparison``: the paper's other methods at a smaller budget.

    ``train`` trains them, and ``evaluate`` scores them, beside ``train.methods`` /
    ``evaluate.methods``, on fewer splits and episodes: on the CPU they cost several times
    what the default's methods do (inner loops, particles, one pass per candidate way or
    pair). Their paired differences with REGRAB are taken on the same splits and the same
    (first) episodes.

    Attributes:
        methods: the methods (registry names); empty: no comparison.
        splits: split folders they run on (empty: every split).
        episodes: test episodes per setting and split they are scored on: the first this many
            of the episodes every method sees, and as many of the NOTA and temperature
            episodes at most.
        max_ways: their training episodes have at most this many ways: ``train.ways`` above
            it are not drawn for them (0: every one). GNN and the pair classifier score every
            pair of ways, so their cost grows with N squared.
    """

    methods: tuple[str, ...] = field(doc="the paper's other methods (registry names), trained and "
                                         "scored beside train.methods and evaluate.methods; "
                                         "empty: no comparison")
    splits: tuple[str, ...] = field(doc="split folders they run on (FewRel has split_0 only); "
                                        "empty: every split")
    episodes: int = field(ge=1, doc="test episodes per setting and split they are scored on: the "
                                    "first this many of those every method sees (and at most as "
                                    "many NOTA and temperature episodes)")
    max_ways: int = field(ge=0, doc="train.ways above this are not drawn for them (0: every one): "
                                    "GNN and the pair classifier score every pair of ways, N^2 in "
                                    "cost")

    def __post_init__(self) -> None:
        registry.check(self.methods, "comparison.methods")

    def schedule(self, cfg: TrainConfig) -> TrainConfig:
        """The ``train`` section as the comparison's methods train: ways capped."""
        if not self.max_ways:
            return cfg
        ways = tuple(w for w in cfg.ways if w <= self.max_ways)
        if not ways:
            raise PipelineError(
                f"comparison.max_ways {self.max_ways} is below every train.ways "
                f"{list(cfg.ways)}; raise it, or set 0 to train the comparison on every one")
        return dataclasses.replace(cfg, ways=ways)

    def runs_on(self, split: str) -> bool:
        """Whether the comparison runs on the split folder named ``split``."""
        return not self.splits or split in self.splits


def load_train(params: Path, benchmark: str | None = None) -> TrainConfig:
    """The ``train`` section, with ``benchmarks.<benchmark>.train``'s keys in place of its own."""
    cfg = load_section(TrainConfig, "train", params)
    if benchmark is None:
        return cfg
    benchmarks = load_benchmarks(params)
    if benchmark not in benchmarks:
        raise PipelineError(f"benchmark {benchmark!r} is not in {params} benchmarks "
                            f"{sorted(benchmarks)}; pass one of those, or add it there")
    changes = benchmarks[benchmark].train
    if not changes:
        return cfg
    raw = {**load_params(params, "train"), **changes}
    return parse_section(TrainConfig, raw, f"train (with benchmarks.{benchmark}.train)")


def load_comparison(params: Path, methods: tuple[str, ...]) -> ComparisonConfig:
    """The ``comparison`` section (none when params has no such section), less the methods
    already in ``methods`` (those run on every split anyway)."""
    if "comparison" not in (load_params(params) or {}):
        return ComparisonConfig(methods=(), splits=(), episodes=1, max_ways=0)
    comparison = load_section(ComparisonConfig, "comparison", params)
    return dataclasses.replace(
        comparison, methods=tuple(m for m in comparison.methods if m not in methods))
