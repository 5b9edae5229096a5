"""Training on N-way K-shot episodes.

Modules:
    config: the ``train`` and ``comparison`` params sections and a run's fingerprint.
    loop: preparing a run and the training loop.
    state: resuming, reusing a finished model, and the run record.
"""
