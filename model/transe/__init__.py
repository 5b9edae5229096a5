"""TransE relation embeddings, the graph's node features.

Modules:
    model: the TransE model and its loss (:class:`TransEConfig`, :class:`TransE`).
    optim: the row-wise Adam, one training step and one epoch.
    ranking: filtered ranks of held-out triples, and their MRR and Hits@k.
    training: the ``train_transe`` params section, checkpoints and the training run.
"""
