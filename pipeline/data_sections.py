"""The params sections of the data stages: ``prepare_fewshot``, ``split_nyt``,
``split_fewrel``, and ``tune_splits`` (``scripts/make_tuning_splits.py``).

Each frozen dataclass is its section's schema, registered here
(:func:`pipeline.sections.register_section`), with the checks its stage makes as it starts
(:func:`check_datasets`, :func:`check_seeds`), so the ``check_params`` stage and the flow's
``-S`` overrides make them too without importing a stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.config import field, register_section
from pipeline.errors import PipelineError

#: A dataset name is a file stem in the raw folder: no separators, no leading dot.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_datasets(datasets: list[str]) -> None:
    """Reject names that are not plain file stems, and names listed twice."""
    for name in datasets:
        if not DATASET_NAME.fullmatch(name):
            raise PipelineError(
                f"prepare_fewshot.datasets: {name!r} is not a file name stem "
                "(letters, digits, _ . -); list the names of RAW/{name}.json files"
            )
    twice = sorted({name for name in datasets if datasets.count(name) > 1})
    if twice:
        raise PipelineError(f"prepare_fewshot.datasets lists {twice} more than once")
    if not datasets:
        raise PipelineError("prepare_fewshot.datasets is empty; list at least one dataset")


@register_section("prepare_fewshot")
@dataclass(frozen=True)
class PrepareFewshotParams:
    """``params.yaml`` section ``prepare_fewshot``: FewRel-format files to convert."""

    datasets: tuple[str, ...] = field(doc="names of data/raw/fewrel/{name}.json files "
                                          "(FewRel format), one Parquet table each")


def check_seeds(seeds: list[int]) -> None:
    """Refuse no seeds and repeated seeds (checked before any work, by the flow too)."""
    if not seeds:
        raise PipelineError("split_nyt.seeds is empty; give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise PipelineError(
            f"split_nyt.seeds has duplicates {seeds}; repeated seeds give identical splits"
        )


#: Sentences of every relation in FewRel 2.0's ``val_nyt.json`` (25 relations x 100; the
#: file is pinned by its sha256 in ``fetch.files``): what a test relation of a split holds.
NYT_SENTENCES = 100


@register_section("split_nyt")
@dataclass(frozen=True)
class SplitParams:
    """``params.yaml`` section ``split_nyt``: the random NYT-25 splits."""

    seeds: tuple[int, ...] = field(doc="one random split of the relations per seed (the "
                                       "paper used one; we average over five)")
    train_relations: int = field(ge=1, doc="relations in each split's training part")
    val_relations: int = field(ge=1, doc="relations in each split's validation part")
    test_relations: int = field(ge=1, doc="relations in each split's test part")
    min_instances: int = field(ge=1, doc="relations with fewer sentences are left out (and "
                                         "listed in splits.yaml): an episode needs K + Q "
                                         "sentences of each relation")

    def test_size(self) -> tuple[int, int]:
        """(relations, sentences per relation) of every split's test part, known without
        the data: what the params checks bound ``evaluate``'s ways and K + Q by."""
        return self.test_relations, NYT_SENTENCES


#: FewRel 1.0's ``val_wiki.json``, the test part: 16 relations of 700 sentences each (the
#: file is pinned by its sha256 in ``fetch.files``).
VAL_WIKI_RELATIONS, VAL_WIKI_SENTENCES = 16, 700


@register_section("split_fewrel")
@dataclass(frozen=True)
class SplitFewrelParams:
    """``params.yaml`` section ``split_fewrel``: train on train_wiki (minus held-out
    relations for validation), test on val_wiki."""

    seed: int = field(doc="seed of the held-out draw")
    heldout_relations: int = field(ge=1, doc="train_wiki relations kept for validation "
                                             "(never trained on)")
    max_per_relation: int = field(ge=0, doc="sentences kept per relation in every part, the "
                                            "first ones in file order (0 = all)")

    def test_size(self) -> tuple[int, int]:
        """(relations, sentences per relation) of the test part, known without the data:
        what the params checks bound ``evaluate``'s ways and K + Q by."""
        return VAL_WIKI_RELATIONS, min(self.max_per_relation or VAL_WIKI_SENTENCES,
                                       VAL_WIKI_SENTENCES)


@register_section("tune_splits")
@dataclass(frozen=True)
class TuneSplitsParams:
    """``params.yaml`` section ``tune_splits``: the test part of every tuning split.

    Read by ``scripts/make_tuning_splits.py``, not a DVC stage.
    """

    relations: int = field(ge=1, doc="FewRel train_wiki relations (in no NYT-25 test set) "
                                     "drawn for the test part of every tuning split")
    per_relation: int = field(ge=1, doc="sentences kept per relation (the first ones, in "
                                        "file order)")
    seed: int = field(doc="seed of the relation draw")
