"""The sentence encoder: a BERT-family transformer with entity markers.

Modules:
    config: the settings (:class:`EncoderConfig`), a schema that imports no torch.
    sentence: loading with the entity markers, which layers train, forward and pooling
        (:class:`SentenceEncoder`).
    tokens: tokenisation with entity markers, cut around the entities
        (:class:`TokenizedSet`).
    layers: one BERT or MPNet layer run on its own, whole or at a few token positions.
    frozen_cache: the lower, frozen layers computed once per sentence and reused by training,
        evaluation and prediction (:class:`LowerCache`, :func:`encode_all`).
    files: where an encoder's files come from (a packaged short name, a local folder, a hub
        id).
"""
