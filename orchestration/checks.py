"""Checks made before any stage runs: a whole params tree as the stages read it, a cluster.

:func:`check_params` validates every section of a changed params tree with its registered
schema (``pipeline.sections``), then the checks that span sections, made by the stages'
own loaders where they exist (``load_train`` merges ``benchmarks.<name>.train`` into
``train``; ``comparison`` caps ``train.ways``), plus the checks a stage makes on its
section as it starts (``split_nyt.seeds``, ``prepare_fewshot.datasets``, the encoder
name). A mistake is then one line before Prefect or DVC starts, not a failed stage after
an hour of upstream work.

:func:`check_scheduler` checks a Dask scheduler address: the form, a TCP connection and
Dask's handshake, each bounded, so an address that accepts connections but is not a
scheduler (a proxy, another service) is refused within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PipelineError
from pipeline.wikidata.engine import check_cluster

#: Seconds Dask's handshake may take; a scheduler answers in milliseconds.
HANDSHAKE_TIMEOUT_S = 5.0


def _ours(name: str, raw: Any) -> bool:
    """Whether a known schema reads section ``name`` as it stands (else another project's)."""
    from pipeline.config import check_section

    try:
        return check_section(name, raw)
    except PipelineError:
        return False


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


#: (keys read, as section or dotted prefixes; the check of (a params file, the folder the
#: stages run in)): run when every section read is ours; a failure names the overrides of
#: those keys.
CROSS_CHECKS: list[tuple[tuple[str, ...], Callable[[Path, Path], Any]]] = [
    (("train", "benchmarks"), _train_configs),
    (("train", "benchmarks", "comparison"), _comparison),
    (("model.encoder.name",), _encoder),
    (("split_nyt.seeds",), _seeds),
    (("prepare_fewshot.datasets",), _datasets),
]


def check_params(before: dict[str, Any], after: dict[str, Any], changed: dict[str, str],
                 root: Path) -> None:
    """Check ``after`` (``before`` with overrides) as every stage will read it.

    Only sections that a known schema reads in ``before`` are checked: a section of another
    project's file is left to its own stage.

    Args:
        before: the params tree as in the file.
        after: the same with the overrides applied.
        changed: ``{key: "-S key=value"}`` of the overrides, to name in the message.
        root: the folder the stages run in (relative paths are found from there).

    Raises:
        PipelineError: ``-S key=value: what the stage would say; change the override``.
    """
    import stages  # noqa: F401  (declares each section's owner, so its schema can load)
    from pipeline.config import check_section

    ours = {name for name in after if name in before and _ours(name, before[name])}

    def fail(read: tuple[str, ...], exc: PipelineError) -> PipelineError:
        reason = str(exc).removesuffix("; fix params.yaml")
        # The overrides the message names, else those of the keys the check reads.
        given = [text for key, text in changed.items() if key in reason] or [
            text for key, text in changed.items()
            if any(key == p or key.startswith(f"{p}.") for p in read)]
        given = " ".join(given or changed.values())
        return PipelineError(f"{given}: {reason}; change the override")

    for name in sorted(ours):
        try:
            check_section(name, after[name])
        except PipelineError as exc:
            raise fail((name,), exc) from None
    checks = [(read, check) for read, check in CROSS_CHECKS
              if {key.split(".")[0] for key in read} <= ours]
    if not checks:
        return
    with tempfile.TemporaryDirectory(prefix="params-check-") as tmp:
        # The stages' loaders read a file: the same tree, written where nobody else looks.
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(after, sort_keys=False))
        for read, check in checks:
            try:
                check(path, root)
            except PipelineError as exc:
                raise fail(read, exc) from None


def check_scheduler(address: str | None, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str | None:
    """Normalise a Dask scheduler address and check that a scheduler answers there.

    Returns:
        ``tcp://host:port``, or None for no cluster.

    Raises:
        PipelineError: a malformed address, nothing listening, or no Dask handshake within
            ``timeout_s`` seconds.
    """
    url = check_cluster(address)
    if url is None:
        return None
    from distributed.comm import connect

    async def handshake() -> None:
        comm = await connect(url, timeout=timeout_s)
        await comm.close()

    try:
        # connect's own timeout does not bound the handshake: a silent peer would hang it.
        asyncio.run(asyncio.wait_for(handshake(), timeout_s))
    except OSError as exc:  # TimeoutError too
        reason = str(exc) or f"no Dask handshake within {timeout_s:g} s"
        raise PipelineError(
            f"no Dask scheduler answers at {url} ({reason}); start one (`dask scheduler`), "
            "fix the address, or drop --cluster to use a local cluster") from exc
    return url
