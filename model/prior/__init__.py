"""The graph prior: relation graph, GCN and the relation names it reads (paper Eq. 5-6).

Modules:
    config: the prior's settings (:class:`GraphPriorConfig`) and the ``build_graph`` section
        (:class:`BuildGraphParams`), schemas that import no torch.
    gcn: the GCN prior :class:`GraphPrior`.
    graph: the relation graph read from Parquet (:class:`RelationGraph`).
    knn: the relation graph as a k-nearest-neighbour graph over relation embeddings.
    labels: relation names and labels, their template sentences and their encodings
        (:class:`LabelText`).
    mix: the held-out weights of the graph and label terms (``mix: heldout``).
"""
