"""Checkpoint files that are data by construction: safetensors for tensors, JSON for the rest.

A pickle (``torch.save``'s format) names functions that run when it is loaded, so a model
file somebody hands you could run any code. Every checkpoint here (trained models, the
train stage's resume state, TransE's state, exported model folders) is instead one
`safetensors <https://huggingface.co/docs/safetensors>`_ file: a length-prefixed JSON
header, then raw tensor bytes. Nothing in it is ever executed; the worst a hostile file can
do is fail to parse, which is reported in one line.

The non-tensor part of a checkpoint (configs, params, histories, optimizer hyper-parameters,
RNG states) is a tree of dicts, lists, strings, numbers, booleans and None. :func:`pack`
moves its tensors out into a flat ``{name: tensor}`` map, leaving ``{"__tensor__": name}``
in their place, and stores the rest as JSON in the header's metadata; tuples and dicts with
non-string keys (an optimizer's state is keyed by parameter index) are tagged so that
:func:`unpack` gives back exactly the tree that was packed.

A file in the old pickle format is refused with a line saying how to convert it
(``regrab-models convert``); conversion is never automatic.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.errors import PipelineError
from pipeline.io import atomic_path

#: Header metadata keys: the format tag of the file, and the JSON tree.
FORMAT_KEY = "format"
TREE_KEY = "tree"
#: The deepest tree accepted (a header nested deeper is hostile or corrupt, not a model).
MAX_DEPTH = 64
#: Leading bytes of torch's two pickle-based formats: a zip archive, and a raw pickle
#: (PROTO opcode and protocol 2-5).
PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
#: The largest header safetensors itself accepts.
MAX_HEADER = 100_000_000
#: Format tag of a TransE training state (written by :mod:`model.transe.training`); a file of
#: another version is refused. It lives here, below TransE and the model files alike, because
#: ``regrab-models convert`` writes TransE states too: importing it from TransE's code would
#: make every stage that reads models depend on that code.
TRANSE_FORMAT = "regrab-transe-2"


def pack(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``tree`` into a JSON-able tree and the tensors it held.

    numpy arrays become tensors and numpy scalars Python numbers.

    Raises:
        TypeError: ``tree`` holds something else (bytes, sets, sparse or quantized tensors,
            keys that are not strings or integers), or nests deeper than :data:`MAX_DEPTH`.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            # unpack refuses such a tree, so it must not be written either.
            raise TypeError(f"cannot store a tree nested deeper than {MAX_DEPTH}")
        if isinstance(obj, np.ndarray):
            obj = torch.from_numpy(np.ascontiguousarray(obj))
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.is_quantized:
                kind = "quantized" if obj.is_quantized else str(obj.layout).split(".")[-1]
                raise TypeError(f"cannot store a {kind} tensor in a checkpoint")
            name = str(len(tensors))
            # safetensors refuses tensors that share memory or are not contiguous.
            tensors[name] = obj.detach().cpu().contiguous().clone()
            return {"__tensor__": name}
        if isinstance(obj, np.generic):
            return obj.item()
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"__float__": repr(obj)}
        if isinstance(obj, tuple):
            return {"__tuple__": [walk(v, depth + 1) for v in obj]}
        if isinstance(obj, list):
            return [walk(v, depth + 1) for v in obj]
        if isinstance(obj, dict):
            # Keys starting "__" could be mistaken for tags: such dicts use the tagged form.
            if all(isinstance(k, str) and not k.startswith("__") for k in obj):
                return {k: walk(v, depth + 1) for k, v in obj.items()}
            bad = [k for k in obj if not isinstance(k, (str, int)) or isinstance(k, bool)]
            if bad:
                raise TypeError(f"cannot store dict keys of type {type(bad[0]).__name__}")
            return {"__dict__": [[k, walk(v, depth + 1)] for k, v in obj.items()]}
        raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint")

    return walk(tree), tensors


def unpack(tree: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """The inverse of :func:`pack`; a malformed tree raises :class:`PipelineError`."""

    def bad(what: str) -> PipelineError:
        return PipelineError(f"{where} is malformed ({what}); re-export or retrain it")

    def walk(obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise bad(f"nested deeper than {MAX_DEPTH}")
        if isinstance(obj, list):
            return [walk(v, depth + 1) for v in obj]
        if not isinstance(obj, dict):
            return obj
        if len(obj) == 1:
            (key, value), = obj.items()
            if key == "__tensor__":
                if not isinstance(value, str) or value not in tensors:
                    raise bad(f"tensor {str(value)[:40]!r} is missing")
                return tensors[value]
            if key == "__float__":
                if value not in ("nan", "inf", "-inf"):
                    raise bad(f"float {str(value)[:40]!r}")
                return float(value)
            if key == "__tuple__" and isinstance(value, list):
                return tuple(walk(v, depth + 1) for v in value)
            if key == "__dict__" and isinstance(value, list):
                if not all(isinstance(kv, list) and len(kv) == 2
                           and isinstance(kv[0], (str, int)) for kv in value):
                    raise bad("a tagged dict whose items are not [key, value] pairs")
                return {k: walk(v, depth + 1) for k, v in value}
        return {k: walk(v, depth + 1) for k, v in obj.items()}

    return walk(tree, 0)


def save(path: str | os.PathLike[str], tree: dict[str, Any], fmt: str) -> None:
    """Write ``tree`` (tensors and plain data) to ``path`` atomically, tagged ``fmt``."""
    from safetensors.torch import save_file

    data, tensors = pack(tree)
    meta = {FORMAT_KEY: fmt, TREE_KEY: json.dumps(data, separators=(",", ":"))}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
        canonical_header(Path(tmp))
        user_mode(Path(tmp))


def save_tensors(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor]) -> None:
    """Write a plain ``{name: tensor}`` safetensors file atomically (an exported model)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
        canonical_header(Path(tmp))
        user_mode(Path(tmp))


def user_mode(path: Path) -> None:
    """Give ``path`` the mode a new file gets under the user's umask (0644 under 022).

    safetensors writes its files 0600 whatever the umask, so models a user exports or trains
    would be unreadable to the group and others who can read every other output.
    """
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def canonical_header(path: Path) -> None:
    """Rewrite the JSON header of a safetensors file in one order, so that the same data
    always gives the same bytes (and the same DVC hash).

    The library keeps the metadata in a hash map whose order changes from process to process.
    Here the metadata comes first with its keys sorted, then the tensors in the order of
    their data, which the library lays out deterministically; the data is left as it is.
    """
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    ordered: dict[str, Any] = {} if meta is None else {"__metadata__": dict(sorted(meta.items()))}
    ordered.update(sorted(header.items(), key=lambda kv: (kv[1]["data_offsets"], kv[0])))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the library has it
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def looks_like_safetensors(head: bytes) -> bool:
    """Whether the first 9 bytes are a safetensors frame: a sane header size, then ``{``."""
    return (len(head) >= 9 and head[8:9] == b"{"
            and 0 < int.from_bytes(head[:8], "little") <= MAX_HEADER)


def refuse_pickle(path: Path, head: bytes) -> None:
    """Raise the one-line refusal for a file in torch's pickle formats.

    A safetensors header size can begin with the same byte as a pickle (0x80), so a file
    framed as safetensors is never taken for one.
    """
    if not looks_like_safetensors(head) and head.startswith(PICKLE_MAGIC):
        raise PipelineError(
            f"checkpoint {path} is in the old pickle format, which can run code when it is "
            f"loaded, so it is refused; if you trust where it came from, convert it with "
            f"`regrab-models convert {path}`, otherwise retrain it"
        )


def load(path: str | os.PathLike[str], fmt: str | tuple[str, ...], what: str = "checkpoint",
         fix: str = "retrain it") -> tuple[str, dict[str, Any]]:
    """Read a file written by :func:`save`: its format tag and tree.

    Args:
        fmt: the format tag(s) accepted.
        what: how errors name the file ("checkpoint", "TransE state", ...).
        fix: what errors tell the user to do about a file that is not usable.

    Raises:
        PipelineError: missing file, pickle, unparsable or hostile header, wrong format.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{what} {path} not found; {fix}")
    with path.open("rb") as fh:
        head = fh.read(9)
    refuse_pickle(path, head)
    fmts = (fmt,) if isinstance(fmt, str) else fmt
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get(FORMAT_KEY) not in fmts:
                raise PipelineError(
                    f"{what} {path} is not a file of this version (format "
                    f"{str(meta.get(FORMAT_KEY))[:40]!r}, want {' or '.join(fmts)}); {fix}"
                )
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
        data = json.loads(meta.get(TREE_KEY, "null"))
    except PipelineError:
        raise
    except (SafetensorError, OSError, ValueError, RecursionError, MemoryError) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else ""
        raise PipelineError(
            f"{what} {path} is unreadable ({type(exc).__name__}: {detail}); {fix}"
        ) from None
    if not isinstance(data, dict):
        raise PipelineError(f"{what} {path} holds no data tree; {fix}")
    return meta[FORMAT_KEY], unpack(data, tensors, f"{what} {path}")


def load_tensors(path: str | os.PathLike[str], what: str, fix: str) -> dict[str, torch.Tensor]:
    """Every tensor of a plain safetensors file (no tree), e.g. an exported model's weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{what} {path} not found; {fix}")
    with path.open("rb") as fh:
        refuse_pickle(path, fh.read(9))
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, MemoryError) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else ""
        raise PipelineError(
            f"{what} {path} is unreadable ({type(exc).__name__}: {detail}); {fix}"
        ) from None
