"""Scoring trained models on the test relations of each split, and off-domain.

Modules:
    config: the ``evaluate`` params section.
    splits: loading a split's models and scoring every method on the same episodes.
    split_episodes: a split's episodes, drawn once, and one head's cells on them.
    scoring: per-query predictions, calibration and NOTA measures.
    uncertainty: every uncertainty score of a query, and out-of-set detection measures.
    calibration: the validation temperature.
    nota: "none of the above" episodes.
    support_noise: episodes with a mislabelled support sentence, and each support
        sentence's suspicion.
    transfer: scoring checkpoints on another domain (SemEval), its relations' texts.
    transfer_report: the transfer stage's metrics and tables.
    own_config: the ``evaluate_own`` params section (a team's held-out own relations).
"""
