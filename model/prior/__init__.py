"""The graph prior: relation graph, GCN and the relation names it reads (paper Eq. 5-6).

Modules:
    gcn: the relation graph read from Parquet, the GCN prior :class:`GraphPrior`, and the
        relation-label text it encodes.
"""
