"""Using a trained model on a user's sentences.

Modules:
    predictor: loading a model and predicting relations for query sentences.
    predictions: what a prediction returns, and one record per query.
    records: support and query records (files' lines, request bodies) read for the predictor.
    abstain: when a prediction abstains, by a cutoff read from the validation relations.
    sentences: the input formats a user hands in.
    config: the ``active_labelling`` params section and the strategies' names, a schema that
        imports no torch.
    active: which pool sentence to label next (the strategies bald, entropy, margin, random).
    labelling: the active_labelling stage's episodes, cache and jobs, one per set and split.
    simulation: a simulated user labelling a pool with each strategy, on cached encodings.
    summary: what a support set gave each candidate relation (prior kind, text read).
    support_check: each support sentence's suspicion, and those flagged as mislabelled.
"""
