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
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from model import transe as transe_code  # noqa: E402
from model.checkpoint import load_transe, save_transe  # noqa: E402
from model.transe import (  # noqa: E402
    TransE,
    TransEConfig,
    filtered_ranks,
    make_optimizer,
    rank_metrics,
    train_epoch,
)
from pipeline.config import field, load_section, select_device, set_threads  # noqa: E402
from pipeline.errors import PipelineError, run_cli  # noqa: E402
from pipeline.io import (  # noqa: E402
    read_parquet,
    remove_stale_temporaries,
    write_json,
    write_parquet,
)
from pipeline.schemas import TRIPLES_SCHEMA, embeddings_schema  # noqa: E402

CHECKPOINT_NAME = "transe.safetensors"


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

    model: TransEConfig
    device: str
    threads: int = field(ge=0)
    checkpoint_every: int = field(ge=1)
    heldout_fraction: float = field(ge=0.0, lt=0.5)
    eval_batch_size: int = field(ge=1)


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


def fingerprint(data: EncodedTriples, train: np.ndarray, device: str = "cpu") -> str:
    """Hash of what a checkpoint's numbers depend on: names, training triples and code.

    The code part (``model/transe.py``, the torch version, the device type and, on CPU,
    the vector instruction set torch dispatches to) keeps a persisted checkpoint written
    by other code or on another machine type from being resumed: its trajectory would
    differ from a fresh run's, so the output would not be what this code computes.
    """
    digest = hashlib.sha256()
    digest.update("\n".join(data.entities.tolist()).encode())
    digest.update(b"\0")
    digest.update("\n".join(data.relations.tolist()).encode())
    digest.update(b"\0")
    digest.update(np.ascontiguousarray(train).tobytes())
    digest.update(b"\0")
    digest.update(Path(transe_code.__file__).read_bytes())
    kind = torch.device(device).type
    isa = torch.backends.cpu.get_cpu_capability() if kind == "cpu" else ""
    digest.update(f"\0torch {torch.__version__} {kind} {isa}".encode())
    return digest.hexdigest()


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
    params = load_section(TrainTransEParams, "train_transe", args.params)
    cfg = params.model
    device = select_device(params.device, "params.yaml train_transe.device")
    set_threads(params.threads)

    data = encode_triples(read_parquet(args.triples, TRIPLES_SCHEMA))
    train_np, held_np = split_heldout(data.triples, params.heldout_fraction, cfg.seed)
    print(
        f"triples: {len(data.triples)} unique ({data.skipped} malformed skipped, "
        f"{data.duplicates} duplicates), {len(data.entities)} entities, "
        f"{len(data.relations)} relations; training on {len(train_np)}, held out {len(held_np)}"
    )
    data_hash = fingerprint(data, train_np, device)
    train = torch.from_numpy(train_np)

    generator = torch.Generator().manual_seed(cfg.seed)
    model = TransE(len(data.entities), len(data.relations), cfg, generator).to(device)
    optimizer = make_optimizer(model)
    start_epoch, losses = 0, []
    ckpt_path = args.checkpoint_dir / CHECKPOINT_NAME if args.checkpoint_dir else None
    if ckpt_path:
        # A kill during a checkpoint write leaves its temporary file behind (atomic_path
        # cannot clean up after SIGKILL); the previous checkpoint is intact.
        remove_stale_temporaries(args.checkpoint_dir)
    state = load_transe(ckpt_path, cfg, data_hash) if ckpt_path else None
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
            save_transe(ckpt_path, model, optimizer, generator, done, losses, data_hash,
                        dataclasses.asdict(params), data.relations.tolist())
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
