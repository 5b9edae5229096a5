"""TransE relation embeddings, the graph's node features.

Modules:
    model: the TransE model, its loss, optimiser and filtered ranking.
    training: the ``train_transe`` params section and the training run.
"""
