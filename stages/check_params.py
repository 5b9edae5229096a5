"""Stage ``check_params``: every section of ``params.yaml`` checked before any other stage runs.

Each stage validates its own section as it starts, but DVC runs stages in order: a bad value
for ``train`` (``dvc exp run -S train.steps=-5``) used to surface only after every stale stage
upstream of ``train`` had run. This stage is upstream of all of them (``fetch`` reads its
output) and depends on the whole of ``params.yaml``, so DVC runs it first whenever a value
changed, and a mistake is one ``error:`` line before any work.

:func:`check_params` validates every section with its registered schema
(``pipeline.sections``), then the checks that span sections, made by the stages' own loaders
where they exist (``load_train`` merges ``benchmarks.<name>.train`` into ``train``;
``comparison`` caps ``train.ways``), plus the checks a stage makes on its section as it starts
(``split_nyt.seeds``, ``prepare_fewshot.datasets``, the encoder name).
``orchestration.overrides --check`` and the Prefect flow call the same function on a params
tree with their overrides applied.

The output holds a fixed sentence, so a stage that reads it is not made stale by a new value
it does not read: DVC reruns only what the changed keys feed.

Usage:
    python -m stages.check_params --params params.yaml --out data/params.checked
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import load_params
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path
from pipeline.sections import known_sections

PARAMS_NAME = "params.yaml"
#: What the output holds: the same bytes for every valid params file.
CHECKED = "every section of params.yaml passed its schema and the checks across sections\n"


def _ours(name: str, raw: Any) -> bool:
    """Whether a known schema reads section ``name`` as it stands (else another project's)."""
    from pipeline.config import check_section

    try:
        return check_section(name, raw)
    except PipelineError:
        return False


class _LazyOurs:
    """The sections of ``after`` that a known schema reads as they stand in ``before``
    (:func:`_ours`), each found out when first asked (``name in ours``)."""

    def __init__(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        self.before, self.after, self.seen = before, after, {}

    def __contains__(self, name: object) -> bool:
        if name not in self.seen:
            self.seen[name] = (name in self.after and name in self.before
                               and _ours(str(name), self.before[name]))
        return self.seen[name]


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
    from stages.split_nyt import check_seeds

    check_seeds(list(load_params(params, "split_nyt")["seeds"]))


def _datasets(params: Path, root: Path) -> None:
    from pipeline.config import load_params
    from stages.prepare_fewshot import check_datasets

    check_datasets(list(load_params(params, "prepare_fewshot")["datasets"]))


def _evaluate_memory(params: Path, root: Path) -> None:
    from model.episodes import Setting
    from model.evaluation.config import EvalConfig
    from model.evaluation.shots import UnequalSetting
    from pipeline.budget import check_memory
    from pipeline.config import load_section

    cfg = load_section(EvalConfig, "evaluate", params)
    # Each setting's episode table (int64 rows) and every method's probabilities.
    per_episode = sum(s.ways * (s.shots + cfg.queries) * 8
                      + len(cfg.methods) * s.ways * cfg.queries * s.ways * 8
                      for s in map(Setting.parse, cfg.settings))
    check_memory(cfg.episodes, per_episode, "evaluate.episodes")
    # An unequal setting's episodes, its _cut1 twin and its _step protocol, b shots at most.
    per_unequal = sum(3 * (u.ways * (u.high + cfg.queries) * 8
                           + len(cfg.methods) * u.ways * cfg.queries * u.ways * 8)
                      for u in map(UnequalSetting.parse, cfg.unequal_settings))
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
    from stages.split_fewrel import SplitFewrelParams
    from stages.split_nyt import SplitParams

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
    from pipeline.budget import check_time
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
    total = sum(n * cost[registry.get(m).stepwise] for m, n in chains.items())
    count = sum(chains.values())
    check_time("the Langevin chains of one split's training and evaluation", count,
               total / max(count, 1), "chain",
               "lower model.langevin.steps (or train.steps, evaluate.episodes)")


#: (keys read, as section or dotted prefixes; the check of (a params file, the folder the
#: stages run in)): run when every section read is ours; a failure names the overrides of
#: those keys.
CROSS_CHECKS: list[tuple[tuple[str, ...], Callable[[Path, Path], Any]]] = [
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
    """Check ``after`` (``before`` with overrides) as every stage will read it.

    With overrides, only sections that a known schema reads in ``before`` are checked: a
    section of another project's file is left to its own stage. Without (``changed`` empty,
    the DVC stage), every section is checked and one no stage reads is refused.

    Args:
        before: the params tree as in the file.
        after: the same with the overrides applied.
        changed: ``{key: "-S key=value"}`` of the overrides, to name in the message; empty
            when ``after`` is the file as it stands.
        root: the folder the stages run in (relative paths are found from there).

    Raises:
        PipelineError: ``-S key=value: what the stage would say; change the override`` (without
            overrides: ``what the stage would say; fix params.yaml``).
    """
    import stages  # noqa: F401  (declares each section's owner, so its schema can load)
    from pipeline.config import check_section

    if changed:
        # Asked section by section, as the checks need it: asking imports the schema.
        ours: Any = _LazyOurs(before, after)
    else:  # the file as it stands: every section is ours, and each must be known
        known = known_sections() or set()
        stray = sorted(name for name in after if name not in known)
        if stray:
            raise PipelineError(f"{PARAMS_NAME} has section(s) {', '.join(stray)} that no "
                                f"stage reads; fix the name or remove them "
                                f"(known: {', '.join(sorted(known))})")
        ours = set(after)

    def fail(read: tuple[str, ...], exc: PipelineError) -> PipelineError:
        reason = str(exc).removesuffix("; fix params.yaml")
        # The overrides the message names, else those of the keys the check reads.
        given = [text for key, text in changed.items() if key in reason] or [
            text for key, text in changed.items()
            if any(key == p or key.startswith(f"{p}.") for p in read)]
        if not changed:  # the file as it stands (the DVC stage)
            return PipelineError(f"{reason}; fix {PARAMS_NAME}")
        given = " ".join(given or changed.values())
        return PipelineError(f"{given}: {reason}; change the override")

    def touched(read: tuple[str, ...]) -> bool:
        return any(key == p or key.startswith(f"{p}.") or p.startswith(f"{key}.")
                   for key in changed for p in read)

    def section(name: str) -> None:
        try:
            check_section(name, after[name])
        except PipelineError as exc:
            raise fail((name,), exc) from None

    def applies(read: tuple[str, ...]) -> bool:
        return all(key.split(".")[0] in ours for key in read)

    # What the overrides touch first, its sections then its checks across sections: a bad
    # override is refused before the schemas of the other sections are imported (the
    # model's pull in torch, many seconds on a busy machine).
    first = [n for n in sorted(after) if touched((n,)) and n in ours]
    for name in first:
        section(name)
    with tempfile.TemporaryDirectory(prefix="params-check-") as tmp:
        # The stages' loaders read a file: the same tree, written where nobody else looks.
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(after, sort_keys=False))

        def cross(read: tuple[str, ...], check: Callable[[Path, Path], Any]) -> None:
            try:
                check(path, root)
            except PipelineError as exc:
                raise fail(read, exc) from None

        for read, check in CROSS_CHECKS:
            if touched(read) and applies(read):
                cross(read, check)
        for name in sorted(after):
            if name not in first and name in ours:
                section(name)
        for read, check in CROSS_CHECKS:
            if not touched(read) and applies(read):
                cross(read, check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=Path(PARAMS_NAME),
                        help="the params file to check (default: params.yaml)")
    parser.add_argument("--out", type=Path, required=True,
                        help="file written when every check passes (a fixed sentence)")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Check the whole params file; write ``--out`` only when it passes."""
    args = build_parser().parse_args(argv)
    params = load_params(args.params)
    check_params(params, params, {}, Path.cwd())
    with atomic_path(args.out) as tmp:
        tmp.write_text(CHECKED)
    print(f"{args.params}: every section checked")


if __name__ == "__main__":
    run_cli(main)
