"""``params.yaml`` section ``evaluate`` (read by the ``evaluate`` and ``transfer`` stages and
``regrab-score``; the scoring itself is :mod:`model.evaluation.splits`)."""

from __future__ import annotations

from dataclasses import dataclass

from model.episodes import Setting
from model.methods import registry
from pipeline.config import field


@dataclass(frozen=True)
class EvalConfig:
    """``params.yaml`` section ``evaluate``.

    Attributes:
        methods: trained methods to evaluate (each needs
            ``<models>/split_i/<method>/model.safetensors``).
        settings: ``{N}w{K}s`` settings; K = 0 is zero-shot (regrab only).
        episodes: episodes per setting and split.
        queries: queries per way.
        seed: episode seed (same episodes for every method).
        splits: split folders to use (empty: every split with trained models).
        floor: add the untrained frozen-encoder row.
        batch_episodes: episodes per forward pass of a head.
        encode_batch: sentences per encoder batch.
        device: auto | cpu | cuda.
        threads: torch intra-op threads (0 = torch default).
        calibration_bins: equal-width confidence bins of ECE and the reliability diagram.
        nota_rates: fractions of NOTA queries, each in [0, 1) (empty: no NOTA episodes).
        nota_settings: settings (K >= 1) that get NOTA episodes.
        nota_episodes: validation NOTA episodes per setting and split, to choose thresholds
            on (the test NOTA episodes are the setting's ``episodes`` test episodes).
        read_names: a relation outside a REGRAB model's graph gets a prior read from its
            name (the split's ``relation_name``: a Wikidata label, or a key such as
            ``Cause-Effect(e1,e2)``) instead of the shared fallback vector.
        temperature_episodes: validation episodes per setting and split on which each model
            gets a temperature (:mod:`model.evaluation.calibration`), reported as the ECE after
            temperature scaling; 0 turns it off (so does a split without ``val.parquet``).
        workers: processes that score models at once, ``threads`` threads each (forked; on
            the CPU only). Every split (or share of its methods) encodes its own sentences
            from an empty cache, so the numbers are the same whatever the count.
    """

    methods: tuple[str, ...]
    settings: tuple[str, ...]
    episodes: int = field(ge=1)
    queries: int = field(ge=1)
    seed: int
    splits: tuple[str, ...]
    floor: bool
    batch_episodes: int = field(ge=1)
    encode_batch: int = field(ge=1)
    device: str
    threads: int = field(ge=0)
    calibration_bins: int = field(ge=1)
    nota_rates: tuple[float, ...] = field(ge=0.0, lt=1.0)
    nota_settings: tuple[str, ...]
    nota_episodes: int = field(ge=1)
    read_names: bool
    temperature_episodes: int = field(ge=0)
    workers: int = field(ge=1)

    def __post_init__(self) -> None:
        if not self.settings:
            raise ValueError("evaluate.settings is empty; list at least one setting, e.g. "
                             "[5w1s, 5w5s]")
        for s in (*self.settings, *self.nota_settings):
            Setting.parse(s)
        if not self.methods:
            raise ValueError("evaluate.methods must name at least one method")
        registry.check(self.methods, "evaluate.methods")
        for s in self.nota_settings:
            if Setting.parse(s).shots == 0:
                raise ValueError(f"evaluate.nota_settings has {s}; NOTA needs K >= 1 shots")

    @property
    def nota(self) -> bool:
        return bool(self.nota_rates and self.nota_settings)

    @property
    def needs_val(self) -> bool:
        return self.nota or self.temperature_episodes > 0
