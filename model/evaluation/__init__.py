"""Scoring trained models on the test relations of each split, and off-domain.

Modules:
    config: the ``evaluate`` params section.
    splits: scoring every method of a split on the same episodes.
    scoring: accuracy, intervals and calibration from per-query scores.
    calibration: the validation temperature.
    nota: "none of the above" episodes.
    transfer: scoring checkpoints on another domain (SemEval).
"""
