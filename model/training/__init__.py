"""Training on N-way K-shot episodes.

Modules:
    config: the ``train`` and ``comparison`` params sections and a run's fingerprint.
    jobs: the train stage's models planned, reused when finished, trained and measured.
    loop: preparing a run and the training loop.
    precision: how a step runs on the hardware: bf16 autocast, fused AdamW, length buckets.
    state: the run record, resuming, and reusing a finished model.
    val_scores: the finished model's uncertainty on the validation relations, kept in its
        checkpoint for ``regrab-predict`` to abstain by.
    val_noise: the finished model's suspicion cutoff for mislabelled support sentences,
        chosen on the validation relations, kept in its checkpoint for ``regrab-predict``.
"""
