"""The paper's released relation features, read from their pickle without running its code.

The REGRAB authors published their TransE relation features (GraphVite on Wikidata5m) as
``embeddings.pkl``: a pickle of ``{"relations": [828 Pids], "embeddings": float32 ndarray
(828, 512)}``. A pickle can run any function it names, so it is read with
:class:`RestrictedUnpickler`, which resolves only the globals numpy needs to rebuild an array;
containers and strings come from plain pickle opcodes and need no globals at all.
:func:`embeddings_table` makes the ``embeddings_schema(dim)`` table the
``import_embeddings`` stage writes.
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pyarrow as pa

from pipeline.errors import PipelineError
from pipeline.schemas import embeddings_schema


def _reconstruct():
    """numpy's array rebuild helper, wherever this numpy version keeps it."""
    try:
        from numpy._core.multiarray import _reconstruct as fn  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct as fn
    return fn


#: The only globals the file may name, found with ``pickletools.dis`` on the released
#: file: ``_reconstruct`` (under its numpy 1.x and 2.x module names), ``ndarray`` and
#: ``dtype``. Everything else in it is dicts, lists, strings, ints and bytes.
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS`.

    A pickle that names any other callable (``os.system``, ``builtins.eval``, a
    class with a malicious ``__reduce__`` ...) fails before anything is called.
    """

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle API
        resolve = ALLOWED_GLOBALS.get((module, name))
        if resolve is None:
            raise PipelineError(
                f"pickle refers to {module}.{name}, which the restricted loader does not admit "
                "(only numpy array reconstruction); the file is not a relation-embeddings "
                "pickle or has been tampered with: re-download it from the official release"
            )
        return resolve()

    def persistent_load(self, pid):  # noqa: D102 - pickle API
        raise PipelineError("pickle uses persistent ids, which relation embeddings never need")


def restricted_loads(data: bytes):
    """Unpickle ``data`` with :class:`RestrictedUnpickler`, errors as PipelineError."""
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except PipelineError:
        raise
    except Exception as exc:  # noqa: BLE001 - every malformed pickle is bad input
        raise PipelineError(
            f"cannot read the pickle ({type(exc).__name__}: {exc}); re-download the file"
        ) from exc


def validate(obj) -> tuple[list[str], np.ndarray]:
    """Check the unpickled object and return (relation ids, float32 (R, D) matrix)."""
    if not isinstance(obj, dict) or not {"relations", "embeddings"} <= set(obj):
        raise PipelineError(
            "pickle must hold a dict with keys 'relations' and 'embeddings'; "
            "is this the REGRAB embeddings.pkl?"
        )
    relations, emb = obj["relations"], obj["embeddings"]
    if not isinstance(relations, list | tuple) or not all(
        isinstance(r, str) and r.strip() for r in relations
    ):
        raise PipelineError("'relations' must be a list of non-empty id strings")
    if (
        not isinstance(emb, np.ndarray)
        or emb.ndim != 2
        or not np.issubdtype(emb.dtype, np.floating)
    ):
        raise PipelineError("'embeddings' must be a 2-D float array (relations x dim)")
    if emb.shape[0] != len(relations):
        raise PipelineError(
            f"{len(relations)} relation ids but {emb.shape[0]} embedding rows; the file is corrupt"
        )
    if emb.shape[0] == 0 or emb.shape[1] == 0:
        raise PipelineError(f"embeddings have shape {emb.shape}; nothing to import")
    if len(set(relations)) != len(relations):
        seen, dupes = set(), set()
        for r in relations:
            (dupes if r in seen else seen).add(r)
        raise PipelineError(f"duplicate relation ids {sorted(dupes)[:5]}; the file is corrupt")
    emb = emb.astype(np.float32)
    if not np.isfinite(emb).all():
        bad = int((~np.isfinite(emb).all(axis=1)).sum())
        raise PipelineError(f"{bad} embedding rows hold NaN or infinity; the file is corrupt")
    return list(relations), emb


def embeddings_table(relations: list[str], emb: np.ndarray) -> pa.Table:
    """An ``embeddings_schema(dim)`` table from ids and a float32 (R, D) matrix."""
    dim = emb.shape[1]
    flat = pa.array(np.ascontiguousarray(emb, dtype=np.float32).reshape(-1), type=pa.float32())
    return pa.table(
        {
            "relation": pa.array(relations, type=pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
        },
        schema=embeddings_schema(dim),
    )
