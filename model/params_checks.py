"""The checks of ``params.yaml`` that span sections, made as the stages will read them.

Each section is checked by its own schema (:mod:`pipeline.sections`); these checks read
typed config through the stages' own loaders where they exist (``load_train`` merges
``benchmarks.<name>.train`` into ``train``; ``comparison`` caps ``train.ways``), plus the
checks a stage makes on its section as it starts (``split_nyt.seeds``,
``prepare_fewshot.datasets``, the encoder name) and the bounds of the cost and memory model
(:mod:`pipeline.budget`: the episodes ``evaluate`` holds, the Langevin chains' time).
:func:`check_params` runs them all through :func:`pipeline.params_check.check_params`; the
``check_params`` stage calls it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.params_check import CrossCheck
from pipeline.params_check import check_params as check_tree


def _train_configs(params: Path, root: Path) -> list[Any]:
    """``train`` as every benchmark's models train with it (``load_train``, as the stage)."""
    from model.training.config import load_train
    from pipeline.config import load_params

    benchmarks = load_params(params).get("benchmarks") or {}
    return [load_train(params), *(load_train(params, name) for name in benchmarks)]


def _comparison(params: Path, root: Path) -> None:
    from model.training.config import load_comparison

    for cfg in _train_configs(params, root):
        load_comparison(params, cfg.methods).schedule(cfg)


def _encoder(params: Path, root: Path) -> None:
    from model.encoder.files import resolve_encoder_path
    from pipeline.config import load_params

    # Stages run in the project root, so a relative encoder folder is found from there.
    with contextlib.chdir(root):
        resolve_encoder_path(load_params(params, "model")["encoder"]["name"])


def _seeds(params: Path, root: Path) -> None:
    from pipeline.config import load_params
    from pipeline.data_sections import check_seeds

    check_seeds(list(load_params(params, "split_nyt")["seeds"]))


def _datasets(params: Path, root: Path) -> None:
    from pipeline.config import load_params
    from pipeline.data_sections import check_datasets

    check_datasets(list(load_params(params, "prepare_fewshot")["datasets"]))


def _evaluate_memory(params: Path, root: Path) -> None:
    from model.episodes import Setting
    from model.evaluation.config import EvalConfig
    from model.evaluation.shots import UnequalSetting
    from pipeline.budget import check_memory, episode_bytes
    from pipeline.config import load_section

    cfg = load_section(EvalConfig, "evaluate", params)
    # Each setting's episode table (int64 rows) and every method's probabilities.
    per_episode = episode_bytes([(s.ways, s.shots) for s in map(Setting.parse, cfg.settings)],
                                cfg.queries, len(cfg.methods))
    check_memory(cfg.episodes, per_episode, "evaluate.episodes")
    # An unequal setting's episodes, its _cut1 twin and its _step protocol, b shots at most.
    per_unequal = 3 * episode_bytes(
        [(u.ways, u.high) for u in map(UnequalSetting.parse, cfg.unequal_settings)],
        cfg.queries, len(cfg.methods))
    check_memory(cfg.unequal_episodes, per_unequal, "evaluate.unequal_episodes")


def _evaluate_sizes(params: Path, root: Path) -> None:
    """Every ``evaluate`` setting fits each benchmark's test part: N ways at most its
    relations, K (or an unequal setting's b) + ``evaluate.queries`` at most the sentences of
    a relation, as the split sections say (a setting that does not fit failed after
    training, when its episodes were drawn)."""
    from model.episodes import Setting
    from model.evaluation.config import EvalConfig
    from model.evaluation.shots import UnequalSetting
    from pipeline.config import load_params, load_section
    from pipeline.data_sections import SplitFewrelParams, SplitParams

    # The benchmarks whose test part is known without the data: the split stage's section
    # and its schema, whose ``test_size`` says how many relations and sentences.
    known = {"nyt25": ("split_nyt", SplitParams), "fewrel": ("split_fewrel", SplitFewrelParams)}

    cfg = load_section(EvalConfig, "evaluate", params)
    wanted = [(s, Setting.parse(s).ways, Setting.parse(s).shots, "evaluate.settings")
              for s in cfg.settings]
    wanted += [(s, u.ways, u.high, "evaluate.unequal_settings")
               for s, u in ((s, UnequalSetting.parse(s)) for s in cfg.unequal_settings)]
    for bench in load_params(params).get("benchmarks") or {}:
        if bench not in known:
            continue
        section, schema = known[bench]
        split = load_section(schema, section, params)
        relations, sentences = split.test_size()
        for text, ways, shots, key in wanted:
            if ways > relations:
                raise PipelineError(
                    f"{key} has {text}: {ways} ways, more than the {relations} test relations "
                    f"of each {bench} split ({section}); give at most {relations} ways")
            if shots + cfg.queries > sentences:
                raise PipelineError(
                    f"{key} has {text}: {shots} shots + evaluate.queries {cfg.queries} = "
                    f"{shots + cfg.queries} sentences per relation, more than the {sentences} "
                    f"each {bench} test relation holds ({section}); give at most "
                    f"{sentences - cfg.queries} shots")


def _labelling_samples(params: Path, root: Path) -> None:
    """``bald`` only for methods whose head draws posterior samples (it failed after the
    labelling stage had loaded every checkpoint)."""
    from model.methods import registry
    from model.predict.config import ActiveLabellingParams
    from pipeline.config import load_section

    cfg = load_section(ActiveLabellingParams, "active_labelling", params)
    for method, strategies in cfg.methods.items():
        if "bald" in strategies and not registry.get(method).samples:
            sampling = ", ".join(m for m in registry.names() if registry.get(m).samples)
            raise PipelineError(
                f"active_labelling.methods.{method} has bald, which ranks by the disagreement "
                f"of posterior samples, and {method} draws none (one prototype per relation); "
                f"drop bald there (methods with samples: {sampling})")


def _langevin_time(params: Path, root: Path) -> None:
    import dataclasses

    from model.episodes import Setting
    from model.evaluation.config import EvalConfig
    from model.methods import registry
    from model.posterior.config import LangevinConfig
    from model.posterior.cost import chain_seconds
    from model.training.config import load_comparison, load_train
    from pipeline.budget import check_chains
    from pipeline.config import load_params, load_section, parse_section

    cfg = parse_section(LangevinConfig, load_params(params, "model")["langevin"],
                        "model.langevin")
    train, ev = load_train(params), load_section(EvalConfig, "evaluate", params)
    comparison = load_comparison(params, train.methods)
    settings = [Setting.parse(s) for s in ev.settings]
    ways = max([*train.ways, *(s.ways for s in settings)])
    shots = max([*train.shots, *(s.shots for s in settings)])
    # Chains of one split: a chain per training step, and per episode of each setting scored.
    chains = {m: train.steps for m in train.methods}
    for m in ev.methods:
        chains[m] = chains.get(m, 0) + ev.episodes * len(settings)
    for m in comparison.methods:
        chains[m] = chains.get(m, 0) + train.steps + comparison.episodes * len(settings)
    stepwise = dataclasses.replace(cfg, likelihood="softmax")
    cost = {False: chain_seconds(cfg, ways, shots)}
    if any(registry.get(m).stepwise for m in chains):
        cost[True] = chain_seconds(stepwise, ways, shots)
    check_chains(chains, {m: cost[registry.get(m).stepwise] for m in chains},
                 "the Langevin chains of one split's training and evaluation",
                 "lower model.langevin.steps (or train.steps, evaluate.episodes)")


#: The checks across sections, in the order they run (:data:`pipeline.params_check.CrossCheck`).
CROSS_CHECKS: list[CrossCheck] = [
    (("train", "benchmarks"), _train_configs),
    (("train", "benchmarks", "comparison"), _comparison),
    (("model.encoder.name",), _encoder),
    (("split_nyt.seeds",), _seeds),
    (("prepare_fewshot.datasets",), _datasets),
    (("evaluate",), _evaluate_memory),
    (("evaluate", "benchmarks", "split_nyt", "split_fewrel"), _evaluate_sizes),
    (("active_labelling",), _labelling_samples),
    (("model.langevin", "train", "benchmarks", "comparison", "evaluate"), _langevin_time),
]


def check_params(before: dict[str, Any], after: dict[str, Any], changed: dict[str, str],
                 root: Path) -> None:
    """:func:`pipeline.params_check.check_params` with :data:`CROSS_CHECKS` (see there)."""
    check_tree(before, after, changed, root, CROSS_CHECKS)
