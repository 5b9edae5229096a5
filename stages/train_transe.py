"""Stage train_transe: TransE relation features from Wikidata triples.

Reads triples (``TRIPLES_SCHEMA``), holds out a small slice for a filtered-MRR
check, trains TransE (``model/transe.py``) on the rest and writes one embedding
per relation (``embeddings_schema(dim)``). Checkpoints (tables, optimiser
moments, epoch, generator state, config) are written atomically every
``checkpoint_every`` epochs; a rerun with the same data and params resumes from
the last one and ends with the same embeddings (bit for bit on CPU) as a run
that was never stopped.

Usage:
    python -m stages.train_transe --triples data/wikidata/triples.parquet \\
        --out data/features/transe.parquet --checkpoint-dir data/checkpoints/transe \\
        --report data/metrics/transe.json [--params params.yaml]
"""

from __future__ import annotations

import os

# libgomp reads OMP_WAIT_POLICY once, when torch is loaded. With its default spin-waiting,
# 2 threads ran 5-10x slower than 1 on a shared 2-core machine (measured); passive waiting
# keeps the 2-thread speed-up. It only takes effect when this module loads torch first
# (python -m stages.train_transe); a value set by the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from model.transe import (  # noqa: E402
    TransE,
    TransEConfig,
    filtered_ranks,
    make_optimizer,
    rank_metrics,
    train_epoch,
)
from pipeline.config import load_params, select_device  # noqa: E402
from pipeline.errors import PipelineError, run_cli  # noqa: E402
from pipeline.io import atomic_path, read_parquet, write_json, write_parquet  # noqa: E402
from pipeline.schemas import TRIPLES_SCHEMA, embeddings_schema  # noqa: E402

#: Bumped when the checkpoint layout changes, so old files are not misread.
CHECKPOINT_FORMAT = 1
CHECKPOINT_NAME = "transe.pt"
#: TransE fields that may change between a checkpoint and its resumption: more
#: epochs simply continue the same trajectory.
RESUMABLE_FIELDS = ("epochs",)


@dataclass(frozen=True)
class TrainTransEParams:
    """The ``train_transe`` section of ``params.yaml``.

    Attributes:
        model: TransE and schedule hyper-parameters.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda[:n]``.
        threads: CPU threads for torch; 0 keeps torch's default (all cores).
        checkpoint_every: Write a checkpoint every this many epochs (and after the last).
        heldout_fraction: Share of triples kept out of training for the MRR check.
        eval_batch_size: Held-out queries ranked against all entities at once.
    """

    model: TransEConfig = field(default_factory=TransEConfig)
    device: str = "auto"
    threads: int = 0
    checkpoint_every: int = 5
    heldout_fraction: float = 0.005
    eval_batch_size: int = 256

    @classmethod
    def from_dict(cls, section: dict) -> TrainTransEParams:
        """Build from the YAML section, naming any unknown or invalid key."""
        if not isinstance(section, dict):
            raise PipelineError("params section train_transe must be a mapping of keys to values")
        model_keys = {f.name for f in dataclasses.fields(TransEConfig)}
        stage_keys = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(section) - model_keys - stage_keys)
        if unknown:
            raise PipelineError(
                f"unknown train_transe params {unknown}; allowed: {sorted(model_keys | stage_keys)}"
            )
        try:
            model = TransEConfig(**{k: v for k, v in section.items() if k in model_keys})
        except (TypeError, ValueError) as exc:
            raise PipelineError(f"bad train_transe params: {exc}; fix params.yaml") from exc
        params = cls(model=model, **{k: v for k, v in section.items() if k in stage_keys})
        if params.checkpoint_every < 1:
            raise PipelineError("train_transe.checkpoint_every must be >= 1; fix params.yaml")
        if not 0.0 <= params.heldout_fraction < 0.5:
            raise PipelineError(
                "train_transe.heldout_fraction must be in [0, 0.5); fix params.yaml"
            )
        if params.threads < 0 or params.eval_batch_size < 1:
            raise PipelineError("train_transe.threads must be >= 0 and eval_batch_size >= 1")
        return params


@dataclass(frozen=True)
class EncodedTriples:
    """Triples as integer ids, with the id -> name tables.

    Attributes:
        triples: (T, 3) int64 head, relation, tail ids, unique rows.
        entities: Entity names, sorted; id i is ``entities[i]``.
        relations: Relation names, sorted; id i is ``relations[i]``.
        skipped: Input rows dropped as malformed (an empty id).
        duplicates: Input rows dropped as repeats of an earlier triple.
    """

    triples: np.ndarray
    entities: np.ndarray
    relations: np.ndarray
    skipped: int
    duplicates: int


def encode_triples(table: pa.Table) -> EncodedTriples:
    """Map a ``TRIPLES_SCHEMA`` table to sorted integer ids, dropping bad and repeated rows.

    Ids are ranks in the sorted name lists, so they do not depend on row order.
    """
    cols = {}
    for name in ("head", "relation", "tail"):
        cols[name] = pc.utf8_trim_whitespace(table[name])
    ok = pc.and_(
        pc.and_(
            pc.greater(pc.utf8_length(cols["head"]), 0),
            pc.greater(pc.utf8_length(cols["relation"]), 0),
        ),
        pc.greater(pc.utf8_length(cols["tail"]), 0),
    )
    ok = pc.fill_null(ok, False)
    skipped = len(table) - pc.sum(ok).as_py() if len(table) else 0
    head = np.asarray(pc.filter(cols["head"], ok).to_numpy(zero_copy_only=False), dtype=str)
    rel = np.asarray(pc.filter(cols["relation"], ok).to_numpy(zero_copy_only=False), dtype=str)
    tail = np.asarray(pc.filter(cols["tail"], ok).to_numpy(zero_copy_only=False), dtype=str)
    if len(head) == 0:
        raise PipelineError("no usable triples in the input; check the triples stage output")
    entities, ent_ids = np.unique(np.concatenate([head, tail]), return_inverse=True)
    relations, rel_ids = np.unique(rel, return_inverse=True)
    n = len(head)
    ids = np.stack([ent_ids[:n], rel_ids, ent_ids[n:]], axis=1).astype(np.int64)
    unique = np.unique(ids, axis=0)  # sorted rows: order-independent
    return EncodedTriples(unique, entities, relations, int(skipped), n - len(unique))


def split_heldout(triples: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Hold out about ``fraction`` of the triples, keeping every id in training.

    A candidate is held out only if its head, tail and relation each still occur
    in another training triple, so every held-out query can be ranked and every
    relation gets an embedding.

    Returns:
        (train, heldout) int64 arrays of shape (T_train, 3) and (T_held, 3).
    """
    want = int(round(fraction * len(triples)))
    if want == 0:
        return triples, triples[:0]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(triples))
    ent_count = np.bincount(triples[:, [0, 2]].ravel())
    rel_count = np.bincount(triples[:, 1])
    held = []
    for i in order:
        h, r, t = triples[i]
        need_h = 2 if h == t else 1  # a self loop uses its entity twice
        if ent_count[h] > need_h and ent_count[t] > need_h and rel_count[r] > 1:
            ent_count[h] -= 1
            ent_count[t] -= 1
            rel_count[r] -= 1
            held.append(i)
            if len(held) == want:
                break
    mask = np.zeros(len(triples), dtype=bool)
    mask[held] = True
    return triples[~mask], triples[np.sort(np.asarray(held, dtype=np.int64))]


def fingerprint(data: EncodedTriples, train: np.ndarray) -> str:
    """Hash of the names and training triples a checkpoint belongs to."""
    digest = hashlib.sha256()
    digest.update("\n".join(data.entities.tolist()).encode())
    digest.update(b"\0")
    digest.update("\n".join(data.relations.tolist()).encode())
    digest.update(b"\0")
    digest.update(np.ascontiguousarray(train).tobytes())
    return digest.hexdigest()


def _comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in RESUMABLE_FIELDS}


def save_checkpoint(
    path: Path,
    model: TransE,
    optimizer,
    generator: torch.Generator,
    epoch: int,
    losses: list[float],
    data_hash: str,
    params: TrainTransEParams,
    relations: np.ndarray,
) -> None:
    """Write everything needed to continue training, atomically.

    The stage params and relation names go in too, so the relation vectors can be
    read back from the checkpoint alone.
    """
    state = {
        "format": CHECKPOINT_FORMAT,
        "config": dataclasses.asdict(model.config),
        "params": dataclasses.asdict(params),
        "relations": relations.tolist(),
        "fingerprint": data_hash,
        "epoch": epoch,
        "losses": list(losses),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": _to_cpu(optimizer.state_dict()),
        "generator": generator.get_state(),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def load_checkpoint(path: Path, config: TransEConfig, data_hash: str) -> dict | None:
    """The checkpoint at ``path`` if it continues this run, else None (with a notice)."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file means "start over"
        print(f"checkpoint {path} is unreadable ({type(exc).__name__}); starting over")
        return None
    if state.get("format") != CHECKPOINT_FORMAT:
        print(f"checkpoint {path} has another format; starting over")
        return None
    if _comparable(state["config"]) != _comparable(dataclasses.asdict(config)):
        print(f"checkpoint {path} was trained with other params; starting over")
        return None
    if state["fingerprint"] != data_hash:
        print(f"checkpoint {path} was trained on other triples; starting over")
        return None
    if state["epoch"] > config.epochs:
        print(
            f"checkpoint {path} is at epoch {state['epoch']} > epochs={config.epochs}; "
            "starting over"
        )
        return None
    return state


def relation_table(model: TransE, relations: np.ndarray) -> pa.Table:
    """The relation embeddings as an ``embeddings_schema(dim)`` table."""
    vectors = model.relations.detach().cpu().numpy().astype(np.float32)  # (R, D)
    dim = vectors.shape[1]
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    return pa.table(
        {
            "relation": pa.array(relations.tolist(), type=pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
        },
        schema=embeddings_schema(dim),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triples", required=True, type=Path, help="TRIPLES_SCHEMA Parquet")
    parser.add_argument("--out", required=True, type=Path, help="relation embeddings Parquet")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="folder for the resumable checkpoint (none: no checkpoints)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="metrics JSON (default: OUT with suffix .metrics.json)",
    )
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Train TransE on the triples and write relation embeddings plus a metrics report.

    Returns:
        The report (also written as JSON).
    """
    args = parse_args(argv)
    params = TrainTransEParams.from_dict(load_params(args.params, "train_transe"))
    cfg = params.model
    device = select_device(params.device)
    if params.threads:
        torch.set_num_threads(params.threads)

    data = encode_triples(read_parquet(args.triples, TRIPLES_SCHEMA))
    train_np, held_np = split_heldout(data.triples, params.heldout_fraction, cfg.seed)
    print(
        f"triples: {len(data.triples)} unique ({data.skipped} malformed skipped, "
        f"{data.duplicates} duplicates), {len(data.entities)} entities, "
        f"{len(data.relations)} relations; training on {len(train_np)}, held out {len(held_np)}"
    )
    data_hash = fingerprint(data, train_np)
    train = torch.from_numpy(train_np)

    generator = torch.Generator().manual_seed(cfg.seed)
    model = TransE(len(data.entities), len(data.relations), cfg, generator).to(device)
    optimizer = make_optimizer(model)
    start_epoch, losses = 0, []
    ckpt_path = args.checkpoint_dir / CHECKPOINT_NAME if args.checkpoint_dir else None
    if ckpt_path:
        # A kill during a checkpoint write leaves its temporary file behind (atomic_path
        # cannot clean up after SIGKILL); the previous checkpoint is intact.
        for stale in args.checkpoint_dir.glob(f".{CHECKPOINT_NAME}.*.tmp"):
            stale.unlink()
    state = load_checkpoint(ckpt_path, cfg, data_hash) if ckpt_path else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        start_epoch, losses = int(state["epoch"]), list(state["losses"])
        print(f"resuming from {ckpt_path} at epoch {start_epoch}/{cfg.epochs}")

    started = time.perf_counter()
    bar = tqdm(
        total=cfg.epochs * len(train),
        initial=start_epoch * len(train),
        unit="triple",
        unit_scale=True,
        desc="TransE",
        dynamic_ncols=True,
    )

    def on_batch(n: int, loss: float) -> None:
        bar.update(n)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    for epoch in range(start_epoch, cfg.epochs):
        losses.append(train_epoch(model, optimizer, train, generator, on_batch))
        done = epoch + 1
        if ckpt_path and (done % params.checkpoint_every == 0 or done == cfg.epochs):
            save_checkpoint(
                ckpt_path,
                model,
                optimizer,
                generator,
                done,
                losses,
                data_hash,
                params,
                data.relations,
            )
    bar.close()
    train_seconds = time.perf_counter() - started
    trained = (cfg.epochs - start_epoch) * len(train)

    report = {
        "triples": len(data.triples),
        "train_triples": len(train_np),
        "heldout_triples": len(held_np),
        "malformed_skipped": data.skipped,
        "duplicates_dropped": data.duplicates,
        "entities": len(data.entities),
        "relations": len(data.relations),
        "epochs": cfg.epochs,
        "resumed_from_epoch": start_epoch,
        "final_loss": losses[-1] if losses else None,
        "train_seconds": round(train_seconds, 2),
        "triples_per_second": round(trained / train_seconds, 1) if trained else None,
        "device": device,
    }
    if len(held_np):
        ranks = filtered_ranks(
            model,
            torch.from_numpy(held_np),
            torch.from_numpy(data.triples),
            batch_size=params.eval_batch_size,
        )
        metrics = rank_metrics(ranks)
        report.update({f"heldout_{k}": round(v, 5) for k, v in metrics.items()})
        print(
            f"held-out filtered MRR {metrics['mrr']:.4f}, Hits@10 {metrics['hits_at_10']:.4f} "
            f"over {len(held_np)} triples (both directions)"
        )

    write_parquet(relation_table(model, data.relations), args.out, embeddings_schema(cfg.dim))
    report_path = args.report or args.out.with_suffix(".metrics.json")
    write_json(report, report_path)
    print(f"wrote {len(data.relations)} relation embeddings (dim {cfg.dim}) to {args.out}")
    return report


if __name__ == "__main__":
    run_cli(main)
