"""Using a trained model on a user's sentences.

Modules:
    predictor: loading a model and predicting relations for query sentences.
    sentences: the input formats a user hands in.
    summary: what a support set gave each candidate relation (prior kind, text read).
"""
