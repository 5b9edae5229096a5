"""``params.yaml`` section ``active_labelling``: the simulated user of the stage of that name.

The schema alone, with the names of the labelling strategies: it imports no torch, so the
params checks (``check_params``, the flow's ``-S`` overrides) read it at once;
:mod:`model.predict.active` ranks by the strategies and :mod:`model.predict.simulation` runs
the user.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.methods import registry
from pipeline.config import DEVICE_FIELD, field, register_section

#: Every strategy, with the line ``--help`` and the reports show for it.
STRATEGIES = {
    "bald": "mutual information between the label and the prototypes (needs posterior "
            "samples: REGRAB)",
    "entropy": "entropy of the predictive distribution",
    "margin": "smallest gap between the two most probable relations first",
    "typiclust": "the most typical sentence of the largest cluster of encodings without a "
                 "label (reads the encodings, not the model's predictions)",
    "random": "a seeded random order, the floor",
}


@register_section("active_labelling")
@dataclass(frozen=True)
class ActiveLabellingParams:
    """``params.yaml`` section ``active_labelling``.

    Attributes:
        benchmark: the ``benchmarks`` entry whose checkpoints label, on every split, and whose
            test relations are the first set.
        transfer_sets: entries of ``transfer.sets`` labelled with the same checkpoints.
        methods: method -> the strategies it runs.
        ways: relations per episode.
        start: labelled sentences per relation at the start.
        pool: unlabelled sentences per relation in the pool.
        queries: held-out sentences per relation that measure the accuracy.
        labels: sentences labelled per relation on average (``ways * labels`` in all).
        episodes: episodes per set and split.
        bar_labels: labels per relation at which REGRAB+BALD is compared with random at the
            end.
        seed: seed of the episodes, the posterior samples and random's order.
        device: where the models run.
        threads: torch threads per process.
        workers: processes labelling at once, one set and split each.
        encode_batch: sentences per encoder batch.
    """

    benchmark: str = field(doc="the benchmarks entry whose checkpoints label (every split) and "
                               "whose test relations are the first set")
    transfer_sets: tuple[str, ...] = field(doc="entries of transfer.sets also labelled, with "
                                               "the same checkpoints (as the transfer stage "
                                               "scores them)")
    methods: dict[str, tuple[str, ...]] = field(
        doc="method -> the strategies it runs: bald (mutual information between label and "
            "prototypes; needs posterior samples, i.e. regrab), entropy, margin, typiclust "
            "(typical sentences of unlabelled clusters), random")
    ways: int = field(ge=2, doc="relations per episode (N)")
    start: int = field(ge=1, doc="labelled sentences per relation at the start")
    pool: int = field(ge=1, doc="unlabelled sentences per relation in the pool")
    queries: int = field(ge=1, doc="held-out sentences per relation that measure the accuracy")
    labels: int = field(ge=1, doc="sentences labelled per relation on average, one at a time "
                                  "(ways x labels in all)")
    episodes: int = field(ge=1, doc="episodes per set and split; every method and strategy "
                                    "labels on the same ones (the run time grows with it: 32 "
                                    "took about 2 minutes on 2 CPU cores)")
    bar_labels: int = field(ge=1, doc="labels per relation at which REGRAB+BALD is compared "
                                      "with random at start + labels (the bar: as accurate "
                                      "with fewer labels)")
    seed: int = field(doc="seed of the episodes, the posterior samples and random's order")
    device: str = field(match=DEVICE_FIELD, doc="auto (CUDA when present), cpu, cuda or cuda:N")
    threads: int = field(ge=0, doc="torch intra-op threads per process (0 = torch's default)")
    workers: int = field(ge=1, doc="processes labelling at once, one set and split each (CPU "
                                   "only); the numbers are the same whatever the count")
    encode_batch: int = field(ge=1, doc="sentences per encoder batch")

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("active_labelling.methods is empty; list e.g. regrab: [bald, "
                             "random]")
        registry.check(list(self.methods), "active_labelling.methods")
        for method, strategies in self.methods.items():
            unknown = [s for s in strategies if s not in STRATEGIES]
            if unknown or not strategies or len(set(strategies)) < len(strategies):
                raise ValueError(f"active_labelling.methods.{method} = {list(strategies)}: "
                                 f"list each of {', '.join(STRATEGIES)} at most once, and "
                                 "at least one")
        if self.labels > self.pool:
            raise ValueError(f"active_labelling.labels {self.labels} exceeds the pool of "
                             f"{self.pool} per relation; raise the pool or lower the labels")
        steps = (self.bar_labels - self.start) * self.ways
        if not 0 <= steps <= self.labels * self.ways:
            raise ValueError(f"active_labelling.bar_labels {self.bar_labels} is not reached: "
                             f"give a whole number between {self.start} and "
                             f"{self.start + self.labels}, e.g. {self.start + 2}")
