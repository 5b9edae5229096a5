"""A trained model as a folder a user can take away: weights, config, encoder, model card.

Layout (the Hugging Face one)::

    DIR/config.json        method and component configs, graph relation ids and labels,
                           training summary, params and data fingerprints, metrics, the
                           uncertainty on validation relations regrab-predict abstains by
    DIR/model.safetensors  the trained weights (encoder top layers, head, graph tensors)
    DIR/encoder/           the pre-trained encoder the weights sit on (safetensors, tokenizer)
    DIR/README.md          the model card

``regrab-predict --checkpoint DIR`` needs nothing else: no project data, no ``params.yaml``.
Everything in the folder is data (JSON and safetensors); nothing in it is executed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model.config import RegrabConfig
from model.encoder.files import quiet_transformers, resolve_encoder_path
from model.files import tensor_file
from model.files.checkpoint import Checkpoint, GraphShape, optional_fields, stored_scores
from pipeline.errors import PipelineError
from pipeline.io import atomic_dir, atomic_entries

#: ``config.json``'s format tag.
FOLDER_FORMAT = "regrab-model-folder-1"
#: Everything :func:`export` writes in a folder; ``--force`` replaces these and no others.
OWN_ENTRIES = ("config.json", "model.safetensors", "README.md", "encoder")
#: What ``save_pretrained`` writes in ``encoder/`` for the encoders export copies; a folder
#: exported before ``config.json`` recorded its ``encoder_files`` is checked against these.
ENCODER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
                 "added_tokens.json", "sentencepiece.bpe.model", "spiece.model",
                 "tokenizer.model", "generation_config.json")
#: What the error messages tell a user to do with a folder that is not usable.
FIX = "export it again with `regrab-models export`"
#: The largest ``config.json`` read (a real one is a few kB; a graph of every Wikidata
#: relation stays far below this).
MAX_CONFIG_BYTES = 16 * 2**20
#: The largest ``--report`` read (the evaluate stage's reports are a few MB).
MAX_REPORT_BYTES = 256 * 2**20
#: Licences of the data a model can be trained on (shared/data README).
DATA_LICENCES = {
    "nyt25": "FewRel 2.0 NYT set (MIT, thunlp/FewRel)",
    "fewrel": "FewRel 1.0 train/val (MIT, thunlp/FewRel)",
    "graph": "Wikidata statements via WD50K and CoDEx-M (MIT); Wikidata itself is CC0",
}


def read(folder: Path) -> Checkpoint:
    """A model folder as the checkpoint it was exported from, and its encoder copy."""
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file():
        raise PipelineError(f"model folder {folder} has no config.json; {FIX}")
    if cfg_path.stat().st_size > MAX_CONFIG_BYTES:
        raise PipelineError(f"model folder {folder}: config.json is over "
                            f"{MAX_CONFIG_BYTES >> 20} MiB, so not a model config; {FIX}")
    try:
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise PipelineError(f"model folder {folder}: config.json is not valid JSON "
                            f"({type(exc).__name__}); {FIX}") from None
    if not isinstance(meta, dict) or meta.get("format") != FOLDER_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise PipelineError(f"model folder {folder}: config.json has format "
                            f"{str(got)[:40]!r}, want {FOLDER_FORMAT}; {FIX}")
    for key in ("config", "graph"):
        if not isinstance(meta.get(key), dict):
            raise PipelineError(f"model folder {folder}: config.json has no {key!r}; {FIX}")
    state = tensor_file.load_tensors(weights, f"model folder {folder} weights", FIX)
    graph = meta["graph"]
    encoder_dir = folder / "encoder"
    where = f"model folder {folder}"
    return Checkpoint(
        config=RegrabConfig.from_dict(meta["config"], f"{where} config"),
        graph=GraphShape.parse(graph.get("relations"), graph.get("feature_dim"),
                               graph.get("edges"), where),
        state=state,
        **{k: v for k, v in optional_fields(meta, where).items() if k not in ("done", "history")},
        encoder_files=str(encoder_dir) if (encoder_dir / "config.json").is_file() else None,
    )


def relation_labels(relations_path: Path | None, ids: list[str]) -> dict[str, str]:
    """English labels of ``ids`` from the relations table (empty when there is none)."""
    if relations_path is None or not relations_path.is_file():
        return {}
    from pipeline.io import read_parquet
    from pipeline.schemas import RELATION_TEXT_SCHEMA

    table = read_parquet(relations_path, RELATION_TEXT_SCHEMA).to_pydict()
    wanted = set(ids)
    return {r: lab for r, lab in zip(table["relation"], table["label"], strict=True)
            if r in wanted and lab}


#: What the ``--report`` errors tell a user to do.
REPORT_FIX = "give metrics/<benchmark>_report.json, or leave --report out"


def check_report(report: Path) -> dict[str, Any]:
    """The ``accuracy`` table of a report the evaluate stage wrote.

    Raises:
        PipelineError: ``report`` is missing, a folder, not JSON, or JSON of another kind.
    """
    if report.is_dir():
        raise PipelineError(f"--report {report} is a folder; {REPORT_FIX}")
    if not report.is_file():
        raise PipelineError(f"--report {report} does not exist (or is not a regular file); "
                            f"{REPORT_FIX}")
    if report.stat().st_size > MAX_REPORT_BYTES:
        raise PipelineError(f"--report {report} is over {MAX_REPORT_BYTES >> 20} MiB, so not "
                            f"a report the evaluate stage wrote; {REPORT_FIX}")
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError, OSError) as exc:
        raise PipelineError(f"--report {report} is not JSON ({type(exc).__name__}); "
                            f"{REPORT_FIX}") from None
    acc = data.get("accuracy") if isinstance(data, dict) else None
    if not isinstance(acc, dict) or not all(isinstance(v, dict) for v in acc.values()):
        raise PipelineError(f"--report {report} is JSON but not a report the evaluate stage "
                            f"wrote (no 'accuracy' table of methods); {REPORT_FIX}")
    return acc


def split_metrics(report: Path | None, split: str, method: str) -> dict[str, Any]:
    """This model's test accuracies (per setting) and the benchmark's mean with its interval."""
    if report is None or not report.exists():
        return {}
    acc = check_report(report).get(method)
    if acc is None:  # a report of other methods: the card has no accuracies for this one
        return {}
    out = {}
    try:
        for setting, row in acc.items():
            if isinstance(row, dict) and split in row.get("per_split", {}):
                out[str(setting)] = {
                    "this_split": round(row["per_split"][split], 2),
                    "mean_over_splits": round(row["mean"], 2),
                    "ci95_over_splits": round(row["ci95"], 2),
                    "n_splits": int(row["n_splits"]),
                    "episodes_per_split": int(row["episodes"]) // max(int(row["n_splits"]), 1)}
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise PipelineError(f"--report {report} is not a report the evaluate stage wrote "
                            f"({type(exc).__name__} in {method!r}); give "
                            "metrics/<benchmark>_report.json, or leave --report out") from None
    return out


def check_out(out: Path, force: bool = False) -> bool:
    """Whether ``out`` may be replaced whole; stop when writing it would lose others' files.

    A missing or empty folder, or one that :func:`export` wrote (its ``config.json`` has
    :data:`FOLDER_FORMAT` and nothing but :data:`OWN_ENTRIES` is in it), is replaced whole.
    Any other folder is refused, or with ``force`` kept, with only :data:`OWN_ENTRIES`
    replaced (returns False).
    """
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out} is a file; give the path of a folder to write")
    others = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not others:
        return True
    cfg = out / "config.json"
    try:
        meta = (json.loads(cfg.read_text(encoding="utf-8"))
                if cfg.is_file() and cfg.stat().st_size <= MAX_CONFIG_BYTES else None)
        ours = meta.get("format") == FOLDER_FORMAT
    except (ValueError, RecursionError, UnicodeDecodeError, AttributeError, OSError):
        meta, ours = None, False
    # An encoder/ holding a file export did not write is never replaced, --force or not
    # (--force replaces encoder/ whole, and so would delete the user's file).
    theirs = _encoder_strangers(out / "encoder", meta if ours else None)
    if theirs:
        shown = ", ".join(f"'encoder/{n}'" for n in theirs[:3]) + (
            " ..." if len(theirs) > 3 else "")
        raise PipelineError(
            f"--out {out}: its encoder/ holds {shown}, which regrab-models export did not "
            "write; export replaces encoder/ whole (--force too) and never deletes what it "
            "did not write: move those files out of encoder/, or give another --out")
    strangers = others if not ours else [n for n in others if n not in OWN_ENTRIES]
    if not strangers:
        return True
    if not force:
        shown = ", ".join(map(repr, strangers[:3])) + (" ..." if len(strangers) > 3 else "")
        raise PipelineError(
            f"--out {out} is not a model folder that regrab-models export wrote (it holds "
            f"{shown}); give a new or empty folder, or add --force to replace only "
            f"{', '.join(OWN_ENTRIES)} there and keep the rest")
    return False


def _encoder_strangers(encoder: Path, meta: dict[str, Any] | None) -> list[str]:
    """The entries of ``encoder`` (paths relative to it) that :func:`export` did not write:
    those outside the list its ``config.json`` records, or, in a folder exported before
    the list was recorded, outside :data:`ENCODER_FILES`."""
    if not encoder.is_dir() or encoder.is_symlink():
        return []
    recorded = (meta or {}).get("encoder_files")
    known = (set(recorded) if isinstance(recorded, list) and all(
        isinstance(n, str) for n in recorded) else set(ENCODER_FILES))
    return sorted(str(p.relative_to(encoder)) for p in encoder.rglob("*")
                  if str(p.relative_to(encoder)) not in known)


def export(model: Checkpoint, checkpoint: Path, out: Path,
           relations_path: Path | None = None, report: Path | None = None,
           benchmark: str | None = None, with_encoder: bool = True,
           force: bool = False) -> Path:
    """Write a train-stage checkpoint as a model folder ``out``, atomically.

    ``out`` as :func:`check_out` allows it: replaced whole, or (``force``, a folder holding
    others' files) only its :data:`OWN_ENTRIES` replaced.

    Args:
        model: the checkpoint as :func:`model.files.loader.read` reads it.
        checkpoint: where it was read from (names its split when the summary does not).
        relations_path: the relations table, for the labels of the graph's relations.
        report: ``metrics/<benchmark>_report.json``, for the card's test accuracies.
        benchmark: the benchmark the model was trained for (named in the card).
        with_encoder: copy the pre-trained encoder into the folder (otherwise loading needs
            the encoder named in the config installed, e.g. ``minilm``).
        force: write into a folder that holds others' files too (see :func:`check_out`).
    """
    whole = check_out(out, force)
    config = model.config.to_dict()
    graph = model.graph
    graph_rel = None if graph is None else graph.relations
    summary = model.summary or {}
    split = summary.get("split") or checkpoint.parent.parent.name
    method = model.config.method
    labels = relation_labels(relations_path, list(graph_rel or []))
    seen = model.relations or {}
    meta = {
        "format": FOLDER_FORMAT,
        "config": config,
        "graph": {"relations": graph_rel,
                  "feature_dim": None if graph is None else graph.feature_dim,
                  "edges": None if graph is None else graph.edges},
        "labels": labels,
        "relations": seen,
        "params": model.params,
        "step": model.step,
        "val_acc": model.val_acc,
        "summary": summary,
        "benchmark": benchmark,
        "metrics": split_metrics(report, split, method),
        **stored_scores(model),
    }
    with atomic_dir(out) if whole else atomic_entries(out, OWN_ENTRIES) as tmp:
        tensor_file.save_tensors(tmp / "model.safetensors", model.state)
        if with_encoder:
            from transformers import AutoModel, AutoTokenizer

            # The checkpoint names the encoder: only a local copy is exported (no download).
            path = resolve_encoder_path(model.config.encoder.name, local_only=True)
            with quiet_transformers():
                AutoTokenizer.from_pretrained(path).save_pretrained(tmp / "encoder")
                AutoModel.from_pretrained(path, add_pooling_layer=False).save_pretrained(
                    tmp / "encoder", safe_serialization=True)
            for stray in (tmp / "encoder").glob("*.bin"):
                stray.unlink()
            for written in (tmp / "encoder").glob("*.safetensors"):
                tensor_file.user_mode(written)
            # What a later export may replace: a file a user adds to encoder/ is kept.
            meta["encoder_files"] = sorted(str(p.relative_to(tmp / "encoder"))
                                           for p in (tmp / "encoder").rglob("*"))
        (tmp / "config.json").write_text(json.dumps(meta, indent=1) + "\n")
        (tmp / "README.md").write_text(model_card(meta, with_encoder))
    return out


def _pct(value: Any) -> str:
    return f"{value:.2f}%" if isinstance(value, (int, float)) else "?"


def adaptation_lines(records: Any) -> list[str]:
    """The card's section on ``regrab-adapt`` runs (none when the model was not adapted)."""
    if not isinstance(records, list) or not records:
        return []
    lines = ["## Adaptation", "", "The encoder was adapted to unlabelled sentences of another "
             "domain after training (`regrab-adapt`); the evaluation below is of the model "
             "before it.", ""]
    for r in records:
        r = r if isinstance(r, dict) else {}
        loss = (f", {r.get('loss', 'InfoNCE')} {r['loss_first']:.4f} to {r['loss_last']:.4f}"
                if isinstance(r.get("loss_first"), float) else "")
        named = (f", labelled by the prior with {r.get('relations')} relations (sha256 "
                 f"`{r.get('relations_sha256') or r.get('relations_digest')}`)"
                 if r.get("relations") else "")
        lines.append(f"- `{r.get('objective')}` on {r.get('sentences')} sentences (sha256 "
                     f"`{r.get('digest')}`){named}, {r.get('steps')} steps in "
                     f"{r.get('seconds')} s of a {r.get('budget_minutes')} min budget{loss}")
    return [*lines, ""]


def model_card(meta: dict[str, Any], with_encoder: bool) -> str:
    """README.md in the Hugging Face model-card layout (YAML front matter, then sections)."""
    cfg, summary, params = meta["config"], meta["summary"] or {}, meta["params"] or {}
    method, bench = cfg.get("method"), meta.get("benchmark") or "unknown"
    inputs = params.get("inputs", {})
    seen = meta["relations"] or {}
    lines = [
        "---",
        "library_name: regrab",
        "license: mit",
        "language: en",
        "pipeline_tag: text-classification",
        "tags: [relation-extraction, few-shot, bayesian, regrab]",
        "---",
        "",
        f"# REGRAB model: {method}, {bench}, {summary.get('split', '?')}",
        "",
        "Few-shot relation classifier (Qu et al., 2020): give it a few labelled sentences per "
        "relation and it labels new sentences, with uncertainty.",
        "",
        "```bash",
        "regrab-predict --checkpoint THIS_FOLDER --support support.jsonl "
        "--queries queries.jsonl --out preds.jsonl",
        "```",
        "",
        "## Model",
        "",
        f"- method: `{method}`; encoder: `{cfg.get('encoder', {}).get('name')}` "
        f"({'copied into encoder/' if with_encoder else 'not included: install it'}), "
        f"pooling `{cfg.get('encoder', {}).get('pooling')}`, "
        f"top {cfg.get('encoder', {}).get('train_layers')} layer(s) trained",
        f"- relation graph: {len(meta['graph']['relations'] or [])} Wikidata relations "
        f"({len(meta['labels'])} with labels in config.json)",
        "",
        "## Training data",
        "",
        f"- benchmark: {bench}; training relations: {', '.join(seen.get('train', [])) or '?'}",
        f"- validation relations (model selection): {', '.join(seen.get('val', [])) or '?'}",
        f"- best validation accuracy {_pct(summary.get('best_val_acc', meta.get('val_acc')))} "
        f"at step "
        f"{summary.get('best_step', meta.get('step'))} of {summary.get('steps', '?')}",
        "",
        *adaptation_lines(summary.get("adaptation")),
        "## Evaluation (test relations of the same benchmark, accuracy %)",
        "",
    ]
    if meta["metrics"]:
        lines += ["| setting | this split | mean over splits | 95% interval | episodes/split |",
                  "|---|---:|---:|---:|---:|"]
        for s, m in meta["metrics"].items():
            lines.append(f"| {s} | {m['this_split']} | {m['mean_over_splits']} | "
                         f"± {m['ci95_over_splits']} | {m['episodes_per_split']} |")
    else:
        lines.append("No evaluation report was given at export.")
    lines += [
        "",
        "These numbers are on relations of the training benchmark's own kind of text. On "
        "relations from other domains accuracy can be far lower; measure it on your data with "
        "`regrab-score`.",
        "",
        "## Fingerprints",
        "",
        *[f"- `{k}`: `{v}`" for k, v in sorted(inputs.items())],
        "",
        "## Licences",
        "",
        *[f"- {v}" for v in DATA_LICENCES.values()],
        "- the encoder keeps its own licence (all-MiniLM-L6-v2, all-mpnet-base-v2: Apache-2.0)",
        "",
    ]
    return "\n".join(lines)
