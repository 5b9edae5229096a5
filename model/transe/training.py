"""TransE training for the ``train_transe`` stage: triples to ids, held-out slice, resumable
epochs, checkpoints and the held-out MRR report.

:func:`train` reads nothing and writes nothing but its checkpoint: it takes a
``TRIPLES_SCHEMA`` table and returns one embedding per relation (``embeddings_schema(dim)``)
with a report. Checkpoints (tables, optimiser moments, epoch, generator state, config) are
written atomically every ``checkpoint_every`` epochs; a rerun with the same data and params
resumes from the last one and ends with the same embeddings (bit for bit on CPU) as a run
that was never stopped. The model and its loss are in :mod:`model.transe.model`, one epoch of
training in :mod:`model.transe.optim`, the held-out ranking in :mod:`model.transe.ranking`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from model.files import tensor_file
from model.files.tensor_file import TRANSE_FORMAT
from model.transe import model as transe_code
from model.transe import optim as transe_optim
from model.transe.config import TrainTransEParams, TransEConfig
from model.transe.model import TransE
from model.transe.optim import make_optimizer, train_epoch
from model.transe.ranking import filtered_ranks, rank_metrics
from pipeline.errors import PipelineError
from pipeline.io import remove_stale_temporaries
from pipeline.schemas import embeddings_schema

log = logging.getLogger(__name__)

#: File name of the checkpoint inside ``--checkpoint-dir``.
CHECKPOINT_NAME = "transe.safetensors"


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

    The code part (``model/transe/model.py`` and ``optim.py``, the torch version, the device
    type and, on CPU, the vector instruction set torch dispatches to) keeps a persisted
    checkpoint written by other code or on another machine type from being resumed: its
    trajectory would differ from a fresh run's, so the output would not be what this code
    computes.
    """
    digest = hashlib.sha256()
    digest.update("\n".join(data.entities.tolist()).encode())
    digest.update(b"\0")
    digest.update("\n".join(data.relations.tolist()).encode())
    digest.update(b"\0")
    digest.update(np.ascontiguousarray(train).tobytes())
    digest.update(b"\0")
    for code in (transe_code, transe_optim):  # what the trajectory depends on
        digest.update(Path(code.__file__).read_bytes())
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



# --- checkpoints -----------------------------------------------------------------------------


def save_transe(path: Path, model: TransE, optimizer: Any, generator: torch.Generator,
                epoch: int, losses: list[float], data_hash: str, params: dict[str, Any],
                relations: list[str]) -> None:
    """Write everything needed to continue TransE training, atomically.

    The stage params and relation names go in too, so the relation vectors can be read
    back from the checkpoint alone.
    """
    tensor_file.save(path, {
        "config": dataclasses.asdict(model.config),
        "params": params,
        "relations": list(relations),
        "fingerprint": data_hash,
        "epoch": epoch,
        "losses": list(losses),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "generator": generator.get_state(),
    }, TRANSE_FORMAT)


def load_transe(path: Path, config: TransEConfig, data_hash: str,
                resumable: tuple[str, ...] = ("epochs",)) -> dict | None:
    """The TransE checkpoint at ``path`` if it continues this run, else None (with a notice).

    Fields in ``resumable`` may differ: more epochs simply continue the same trajectory.
    """
    if not path.exists():
        return None
    try:
        _, state = tensor_file.load(path, TRANSE_FORMAT, "TransE state", "starting over")
    except PipelineError as exc:  # any unusable file means "start over"
        log.warning("%s", exc)
        return None

    def comparable(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in resumable}

    reason = None
    if not all(isinstance(state.get(k), dict) for k in ("config", "model", "optimizer")):
        reason = "lacks its config, weights or optimizer state"
    elif comparable(state["config"]) != comparable(dataclasses.asdict(config)):
        reason = "was trained with other params"
    elif state["fingerprint"] != data_hash:
        reason = "was trained on other triples, or by other code or hardware"
    elif state["epoch"] > config.epochs:
        reason = f"is at epoch {state['epoch']} > epochs={config.epochs}"
    if reason:
        log.warning("checkpoint %s %s; starting over", path, reason)
        return None
    return state


# --- training ---------------------------------------------------------------------------------


def train(triples: pa.Table, params: TrainTransEParams, device: str,
          checkpoint_dir: Path | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """Train TransE on a ``TRIPLES_SCHEMA`` table, resuming from ``checkpoint_dir``'s checkpoint.

    Args:
        triples: the triples; malformed and repeated rows are dropped and counted.
        params: the ``train_transe`` section.
        device: where to train (chosen by the caller).
        checkpoint_dir: folder of the resumable checkpoint (None: no checkpoints).

    Returns:
        The relation embeddings (``embeddings_schema(dim)``) and the report: counts, loss,
        speed and, when triples were held out, the filtered MRR and Hits@k on them.
    """
    cfg = params.model
    data = encode_triples(triples)
    train_np, held_np = split_heldout(data.triples, params.heldout_fraction, cfg.seed)
    print(
        f"triples: {len(data.triples)} unique ({data.skipped} malformed skipped, "
        f"{data.duplicates} duplicates), {len(data.entities)} entities, "
        f"{len(data.relations)} relations; training on {len(train_np)}, held out {len(held_np)}"
    )
    model, start_epoch, losses, train_seconds = _fit(data, train_np, params, device,
                                                     checkpoint_dir)
    trained = (cfg.epochs - start_epoch) * len(train_np)
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
    return relation_table(model, data.relations), report


def _fit(data: EncodedTriples, train_np: np.ndarray, params: TrainTransEParams, device: str,
         checkpoint_dir: Path | None) -> tuple[TransE, int, list[float], float]:
    """The epoch loop, from the checkpoint if it continues this run.

    Returns:
        The model, the epoch it resumed from, every epoch's loss and the seconds trained.
    """
    cfg = params.model
    data_hash = fingerprint(data, train_np, device)
    train_ids = torch.from_numpy(train_np)

    generator = torch.Generator().manual_seed(cfg.seed)
    model = TransE(len(data.entities), len(data.relations), cfg, generator).to(device)
    optimizer = make_optimizer(model)
    start_epoch, losses = 0, []
    ckpt_path = checkpoint_dir / CHECKPOINT_NAME if checkpoint_dir else None
    if ckpt_path:
        # A kill during a checkpoint write leaves its temporary file behind (atomic_path
        # cannot clean up after SIGKILL); the previous checkpoint is intact.
        remove_stale_temporaries(checkpoint_dir)
    state = load_transe(ckpt_path, cfg, data_hash) if ckpt_path else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        start_epoch, losses = int(state["epoch"]), list(state["losses"])
        print(f"resuming from {ckpt_path} at epoch {start_epoch}/{cfg.epochs}")

    started = time.perf_counter()
    bar = tqdm(
        total=cfg.epochs * len(train_ids),
        initial=start_epoch * len(train_ids),
        unit="triple",
        unit_scale=True,
        desc="TransE",
        dynamic_ncols=True,
    )

    def on_batch(n: int, loss: float) -> None:
        bar.update(n)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    for epoch in range(start_epoch, cfg.epochs):
        losses.append(train_epoch(model, optimizer, train_ids, generator, on_batch))
        done = epoch + 1
        if ckpt_path and (done % params.checkpoint_every == 0 or done == cfg.epochs):
            save_transe(ckpt_path, model, optimizer, generator, done, losses, data_hash,
                        dataclasses.asdict(params), data.relations.tolist())
    bar.close()
    return model, start_epoch, losses, time.perf_counter() - started
