"""Scoring trained models on the test relations of each split, and off-domain.

Modules:
    config: the ``evaluate`` params section.
    splits: loading a split's models and scoring every method on the same episodes.
    split_episodes: a split's episodes, drawn once, and one head's cells on them.
    scoring: per-query scores, calibration and NOTA measures.
    calibration: the validation temperature.
    nota: "none of the above" episodes.
    transfer: scoring checkpoints on another domain (SemEval).
"""
