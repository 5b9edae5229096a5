"""``regrab-serve``: a trained model kept loaded behind HTTP, its floor above ``model/`` and
``pipeline/`` (it imports those two, never ``cli/``, ``stages/`` or ``orchestration/``).

Modules:
    main: the command: options, limits, the uvicorn server and its signals.
    app: the endpoints, errors as JSON, the token, metrics and body-size middleware.
    bodies: request schemas, limits, and reading bodies into support sets and queries.
    service: the answering version, loading and swapping versions, support sets, predicting.
    versions: which model to load (a checkpoint path or a registry reference) and its name.
    batcher: concurrent requests on one support set answered by one forward pass.
    support_sets: registered support sets by content id, in a bounded LRU cache.
    metrics: the Prometheus metrics.
"""
