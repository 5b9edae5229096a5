"""TransE relation embeddings, the graph's node features.

Modules:
    config: the ``train_transe`` params section (:class:`TransEConfig`,
        :class:`TrainTransEParams`), a schema that imports no torch.
    model: the TransE model and its loss (:class:`TransE`).
    optim: the row-wise Adam, one training step and one epoch.
    ranking: filtered ranks of held-out triples, and their MRR and Hits@k.
    training: checkpoints and the training run.
"""
