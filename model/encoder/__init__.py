"""The sentence encoder: a BERT-family transformer with entity markers.

Modules:
    sentence: settings (:class:`EncoderConfig`), tokenisation with entity markers, forward
        and pooling (:class:`SentenceEncoder`).
    frozen_cache: the lower, frozen layers computed once per sentence and reused by training,
        evaluation and prediction (:class:`LowerCache`, :func:`encode_all`).
    files: where an encoder's files come from (a packaged short name, a local folder, a hub
        id).
"""
