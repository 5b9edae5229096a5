"""The graph prior: relation graph, GCN and the relation names it reads (paper Eq. 5-6).

Modules:
    gcn: the GCN prior :class:`GraphPrior` and its settings (:class:`GraphPriorConfig`).
    graph: the relation graph read from Parquet (:class:`RelationGraph`).
    labels: relation names and labels, their template sentences and their encodings
        (:class:`LabelText`).
"""
