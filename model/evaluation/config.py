"""``params.yaml`` sections ``evaluate`` (read by the ``evaluate`` and ``transfer`` stages and
``regrab-score``; the scoring itself is :mod:`model.evaluation.splits`) and ``transfer`` (read
by the ``transfer`` and ``active_labelling`` stages; :mod:`model.evaluation.transfer`).

Schemas only: this module imports no torch, so the params checks read it at once."""

from __future__ import annotations

from dataclasses import dataclass

from model.episodes import Setting
from model.evaluation.shots import UnequalSetting
from model.methods import registry
from pipeline.config import DEVICE_FIELD, field, register_section


@register_section("evaluate")
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
        noisy_setting: a setting (K >= 2) also scored as ``<setting>_noisy`` when it is one
            of ``settings``: its episodes with one support sentence of one way replaced by a
            sentence of another way (:mod:`model.evaluation.support_noise`); empty: none.
        noisy_episodes: how many of that setting's episodes (the first ones) are scored noisy.
        workers: processes that score models at once, ``threads`` threads each (forked; on
            the CPU only). Every split (or share of its methods) encodes its own sentences
            from an empty cache, so the numbers are the same whatever the count.
        unequal_settings: ``{N}w{a}-{b}s`` settings whose ways have a to b shots each; each
            also brings its ``_cut1`` twin and its ``_step`` protocol
            (:mod:`model.evaluation.shots`).
        unequal_episodes: test episodes per unequal setting, twin and step set, and split.
    """

    methods: tuple[str, ...] = field(doc="trained methods to evaluate (each needs "
                                         "<models>/split_i/<method>/model.safetensors)")
    settings: tuple[str, ...] = field(doc="{N}w{K}s settings scored; K = 0 is zero-shot (regrab "
                                          "only)")
    episodes: int = field(ge=1, doc="test episodes per setting and split")
    queries: int = field(ge=1, doc="queries per way")
    seed: int = field(doc="episode seed (the same episodes for every method)")
    splits: tuple[str, ...] = field(doc="split folders to use (empty: every split with trained "
                                        "models)")
    floor: bool = field(doc="add the untrained frozen-encoder row")
    batch_episodes: int = field(ge=1, doc="episodes per forward pass of a head")
    encode_batch: int = field(ge=1, doc="sentences per encoder batch")
    device: str = field(match=DEVICE_FIELD, doc="auto (CUDA when present), cpu, cuda or cuda:N")
    threads: int = field(ge=0, doc="torch intra-op threads per process (0 = torch's default)")
    calibration_bins: int = field(ge=1, doc="equal-width confidence bins of the ECE and the "
                                            "reliability diagram (Guo et al., 2017)")
    nota_rates: tuple[float, ...] = field(ge=0.0, lt=1.0, doc="fractions of none-of-the-above "
                                                              "queries (FewRel 2.0), each below "
                                                              "1; empty: no NOTA episodes")
    nota_settings: tuple[str, ...] = field(doc="settings (K >= 1) that get NOTA episodes")
    nota_episodes: int = field(ge=1, doc="validation NOTA episodes per setting and split, on "
                                         "which the thresholds are chosen")
    read_names: bool = field(doc="a relation outside a REGRAB model's graph gets a prior read "
                                 "from its name (false: the shared fallback vector)")
    temperature_episodes: int = field(ge=0, doc="validation episodes per setting and split on "
                                                "which each model gets a temperature (temperature "
                                                "scaling); the reports show the ECE after it next "
                                                "to the raw ECE; 0 turns it off")
    noisy_setting: str = field(doc="a setting (K >= 2) also scored as <setting>_noisy when it "
                                   "is one of `settings`: the same episodes with one support "
                                   "sentence of one way replaced by a sentence of another way "
                                   "of the episode; empty: none")
    noisy_episodes: int = field(ge=1, doc="the first this many of the noisy setting's episodes "
                                          "are scored with a mislabelled support sentence "
                                          "(paired with the same clean ones)")
    workers: int = field(ge=1, doc="processes scoring at once (one per split, or per share of "
                                   "methods), `threads` threads each; the numbers are the same "
                                   "whatever the count")

    unequal_settings: tuple[str, ...] = field(
        doc="{N}w{a}-{b}s settings, each way with a to b shots drawn uniformly; each also "
            "scores its _cut1 twin (the same episodes, one sentence per way) and its _step "
            "protocol (one way with b sentences, the others a)")
    unequal_episodes: int = field(ge=1, doc="test episodes per unequal setting, twin and step "
                                            "protocol, and split (fewer than episodes: they "
                                            "cost repro time)")

    def __post_init__(self) -> None:
        for s in self.unequal_settings:
            UnequalSetting.parse(s)
        for key in ("settings", "unequal_settings"):
            listed = getattr(self, key)
            twice = sorted({s for s in listed if listed.count(s) > 1})
            if twice:  # scored twice, one row of the report overwriting the other
                raise ValueError(f"evaluate.{key} lists {', '.join(twice)} more than once; "
                                 "name each setting once")
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
        if self.noisy_setting and Setting.parse(self.noisy_setting).shots < 2:
            raise ValueError(f"evaluate.noisy_setting {self.noisy_setting} has fewer than 2 "
                             "shots, so nothing is left of a way beside its mislabelled "
                             "sentence; name a setting with K >= 2, e.g. 5w5s, or leave it "
                             "empty")

    @property
    def noisy(self) -> str | None:
        """The setting scored with a mislabelled support sentence too, when it is scored."""
        return self.noisy_setting if self.noisy_setting in self.settings else None

    @property
    def nota(self) -> bool:
        return bool(self.nota_rates and self.nota_settings)

    @property
    def needs_val(self) -> bool:
        return self.nota or self.temperature_episodes > 0


@dataclass(frozen=True)
class TransferSet:
    """One transfer set: a FEWSHOT_SCHEMA table made by ``prepare_fewshot``."""

    data: str = field(doc="a FEWSHOT_SCHEMA table made by prepare_fewshot (e.g. "
                          "data/fewshot/val_semeval.parquet)")
    title: str = field(doc="the set's name in reports")
    relations: str | None = field(
        default=None,
        doc="(optional) a JSON file mapping each relation key to [name, description] (FewRel's "
            "pid2name.json format), as a user would write them: the names replace those read "
            "from the keys, and priors with model.prior.descriptions read the descriptions; "
            "null: names from the keys only")
    benchmarks: tuple[str, ...] = field(
        default=(),
        doc="(optional) the benchmarks whose checkpoints are scored on this set (empty: every "
            "one); e.g. FewRel val_wiki only for FewRel's, whose test relations they are, as "
            "NYT-25's checkpoints trained on half of them")
    shuffle: bool = field(
        default=False,
        doc="(optional) stress test: each relation gets another relation's id, name and "
            "description (a seeded derangement), so every prior points at the wrong relation "
            "while the sentences stay")
    nota: bool = field(
        default=False,
        doc="(optional) also score out-of-set detection and temperature scaling here "
            "(evaluate.nota_rates and nota_settings); with no validation relations in the set, "
            "thresholds, temperatures and the best uncertainty score are chosen on other "
            "episodes of the same relations")
    unequal: bool = field(
        default=False,
        doc="(optional) also score evaluate.unequal_settings here (ways with unequal shots, "
            "their _cut1 twins and _step protocols)")


@register_section("transfer")
@dataclass(frozen=True)
class TransferParams:
    """``params.yaml`` section ``transfer``.

    Attributes:
        sets: ``{name: {data, title}}``; each is scored against every benchmark's models.
        per_relation: sentences kept per relation (0: all).
        settings: ``{N}w{K}s`` settings scored.
        episodes: episodes per setting and checkpoint split.
        seed: seed of the per-relation cut.
    """

    sets: dict[str, TransferSet] = field(doc="sets of relations and text no model trains on, each "
                                             "scored against every benchmark's models")
    per_relation: int = field(ge=0, doc="sentences kept per relation (0: all)")
    settings: tuple[str, ...] = field(doc="{N}w{K}s settings scored")
    episodes: int = field(ge=1, doc="episodes per setting and checkpoint split (intervals are "
                                    "over splits)")
    seed: int = field(doc="seed of the per-relation cut (a random choice of sentences)")

    def __post_init__(self) -> None:
        if not self.sets:
            raise ValueError("transfer.sets is empty; list at least one set")
        if not self.settings:
            raise ValueError("transfer.settings is empty; list e.g. [5w1s, 5w5s]")
        for s in self.settings:
            Setting.parse(s)
