"""The graph prior: relation graph, GCN and the relation names it reads (paper Eq. 5-6).

Modules:
    config: the prior's settings (:class:`GraphPriorConfig`), a schema that imports no torch.
    gcn: the GCN prior :class:`GraphPrior`.
    graph: the relation graph read from Parquet (:class:`RelationGraph`).
    labels: relation names and labels, their template sentences and their encodings
        (:class:`LabelText`).
    mix: the held-out weights of the graph and label terms (``mix: heldout``).
"""
