"""``regrab-serve``: keep a trained model loaded and answer predictions over HTTP.

Where ``regrab-predict`` imports torch, loads the model and encodes the support set on every
call, the service does each once: support sets are registered once (``POST
/v1/support-sets``), and concurrent queries on one support set are answered by one forward
pass (those that arrived while the previous pass ran: :mod:`serve.batcher`). The model is
``--checkpoint PATH`` or a version of the model registry, ``--model REF`` (default
``regrab``, the promoted version); ``--watch-registry SECONDS`` loads a newly promoted
version beside the old one and switches.
Endpoints and bodies: :mod:`serve.app`, and ``/docs`` on a running service.

It binds 127.0.0.1; bound elsewhere it needs ``--token`` (or ``REGRAB_SERVE_TOKEN``), which
clients send as ``Authorization: Bearer <token>``. SIGTERM (or Ctrl-C) stops taking requests,
answers those already taken, and exits 0.

Usage:
    regrab-serve --checkpoint models/nyt25/split_0/regrab/model.safetensors [--port 8000]
    regrab-serve --model regrab --watch-registry 60 [--host 0.0.0.0 --token ...]

A promoted version that fails to load (its bytes not pushed yet, say) leaves the old one
answering, ``/ready`` says why, and the watcher tries it again after 10 polls, then 20, ...
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from pipeline.errors import PipelineError, run_cli

#: Defaults of the request limits, from the costs measured on a 2-core machine
#: (docs/performance.md#regrab-serve): a request of 256 queries is 2 to 6 s there, a support
#: set of 1,000 sentences about 15 s to encode; 4 MiB holds either with room to spare.
MAX_QUERIES = 256
MAX_SUPPORT = 1000
MAX_RELATIONS = 100
MAX_BODY_MIB = 4
#: No wait by default: a pass takes the requests that arrived while the previous one ran, and
#: a wait for more measured no better (docs/performance.md#regrab-serve).
MAX_WAIT_MS = 0.0
TOKEN_ENV = "REGRAB_SERVE_TOKEN"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="regrab-serve", description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, help="model.safetensors of the train stage, "
                       "or a model folder (regrab-models export)")
    which.add_argument("--model", default=None, metavar="REF",
                       help="a registry version: regrab (the promoted one, the default), "
                            "regrab@v0.3.0, regrab#prod, optionally :benchmark/split_K/method")
    p.add_argument("--root", type=Path, default=Path("."),
                   help="the project whose registry --model reads (default: here)")
    p.add_argument("--watch-registry", type=float, default=None, metavar="SECONDS",
                   help="poll the registry this often; a new version of --model is loaded "
                        "beside the old one and answers once loaded")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                   help=f"bearer token clients must send (default ${TOKEN_ENV}); required "
                        "when --host is not a loopback address")
    p.add_argument("--max-wait-ms", type=float, default=MAX_WAIT_MS,
                   help="how long the first request of a forward pass waits for more on its "
                        "support set (default 0: a pass takes the requests that arrived while "
                        "the previous one ran)")
    p.add_argument("--max-batch", type=int, default=256, help="queries per forward pass")
    p.add_argument("--max-queries", type=int, default=MAX_QUERIES, help="queries per request")
    p.add_argument("--max-support", type=int, default=MAX_SUPPORT,
                   help="support rows per support set")
    p.add_argument("--max-relations", type=int, default=MAX_RELATIONS,
                   help="candidate relations per support set")
    p.add_argument("--max-body-mib", type=float, default=MAX_BODY_MIB, help="request body size")
    p.add_argument("--cache-sets", type=int, default=256, help="support sets kept")
    p.add_argument("--cache-mib", type=float, default=512,
                   help="memory the kept support sets' encodings may hold")
    p.add_argument("--abstain-rate", type=float, default=None, metavar="R",
                   help="as regrab-predict's --abstain-rate")
    p.add_argument("--abstain-score", default=None, metavar="NAME",
                   help="as regrab-predict's --abstain-score")
    p.add_argument("--threshold", type=float, default=None, metavar="P",
                   help="as regrab-predict's --threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of the posterior samples")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--batch-size", type=int, default=16,
                   help="sentences per encoder batch; a pass's queries are sorted by length "
                        "and cut into batches of this many, so fewer are padded")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of the model's worker, at most the CPUs (0: on a CPU "
                        "one less than the CPUs, at least 1, leaving one to read requests "
                        "and write answers; on a GPU torch's default)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """One ``error:`` line for a value the service cannot start with."""
    if args.checkpoint is not None and not args.checkpoint.exists():
        raise PipelineError(f"--checkpoint {args.checkpoint} does not exist; give a "
                            "model.safetensors or an exported model folder")
    if args.watch_registry is not None:
        if args.checkpoint is not None:
            raise PipelineError("--watch-registry follows a registry reference; give --model "
                                "REF instead of --checkpoint")
        if not 1 <= args.watch_registry <= 86400:
            raise PipelineError(f"--watch-registry {args.watch_registry}: give 1 to 86400 "
                                "seconds")
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not args.token:
        raise PipelineError(f"--host {args.host} is reachable from other machines; give "
                            f"--token (or set {TOKEN_ENV}) so only clients that send it are "
                            "answered, or bind 127.0.0.1")
    if not 0 < args.port < 65536:
        raise PipelineError(f"--port {args.port}: give 1 to 65535")
    if not 0 <= args.max_wait_ms <= 1000:
        raise PipelineError(f"--max-wait-ms {args.max_wait_ms}: give 0 to 1000")
    for flag in ("max_batch", "max_queries", "max_support", "max_relations", "cache_sets",
                 "batch_size"):
        if getattr(args, flag) < 1:
            raise PipelineError(f"--{flag.replace('_', '-')} must be 1 or more")
    if args.max_body_mib <= 0 or args.cache_mib <= 0:
        raise PipelineError("--max-body-mib and --cache-mib must be above 0")
    if not 0 <= args.threads <= len(os.sched_getaffinity(0)):
        raise PipelineError(f"--threads {args.threads}: give 0 (automatic) or 1 to "
                            f"{len(os.sched_getaffinity(0))}, the CPUs this process may use")


def worker_threads(requested: int, device: str) -> int:
    """Torch threads for the model's worker: ``requested``, or when 0, on a CPU one less than
    the CPUs this process may use (at least 1), the event loop that reads requests and writes
    answers keeping a core. On a loaded 2-core machine 1 thread answered as many queries per
    second as 2 within the noise and spent less CPU per query (docs/performance.md)."""
    if requested or device != "cpu":
        return requested
    return max(1, len(os.sched_getaffinity(0)) - 1)


def serve(argv: list[str] | None = None) -> None:
    """Start the service; returns when a signal has stopped it and its requests are done."""
    args = parse_args(argv)
    from pipeline.config import select_device, set_threads
    from serve.app import create_app
    from serve.bodies import Limits
    from serve.service import Service, Settings
    from serve.versions import ModelSpec

    device = select_device(args.device, "--device")
    threads = worker_threads(args.threads, device)
    set_threads(threads)
    spec = ModelSpec(checkpoint=args.checkpoint,
                     ref=None if args.checkpoint is not None else (args.model or "regrab"))
    settings = Settings(
        root=args.root.resolve(), device=device, threads=threads,
        predictor={"seed": args.seed, "threshold": args.threshold,
                   "abstain_rate": args.abstain_rate, "abstain_score": args.abstain_score,
                   "batch_size": args.batch_size},
        max_wait_s=args.max_wait_ms / 1000, max_batch=args.max_batch,
        cache_sets=args.cache_sets, cache_bytes=int(args.cache_mib * 2**20))
    limits = Limits(int(args.max_body_mib * 2**20), args.max_queries, args.max_support,
                    args.max_relations)
    app = create_app(Service(settings), limits, spec, args.token, args.watch_registry)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            access_log=args.access_log, timeout_graceful_shutdown=None)
    server = _Server(config)
    server.run()
    if not server.started:
        raise PipelineError(f"could not serve on {args.host}:{args.port} (in use, or not an "
                            "address of this machine: see the log above); give another "
                            "--port or --host")


class _Server(uvicorn.Server):
    """uvicorn's server, except that SIGTERM and SIGINT end the process with 0 once the
    requests taken are answered (uvicorn raises the signal again after its drain, which
    would end it with 143 or 130)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        saved = {sig: signal.signal(sig, self.handle_exit)
                 for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry. Until the server takes signals (imports take seconds), SIGTERM
    exits 0 at once: no request has been taken. Bad options end in one ``error:`` line."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_cli(serve, argv)


if __name__ == "__main__":
    main()
