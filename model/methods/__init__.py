"""Every few-shot method: REGRAB and its baselines, one module each, and their registry.

A method module imports :mod:`~model.methods.base`, the registry's ``Method`` and helpers
(posterior, prior, encoder), never another method.

Modules:
    base: the :class:`Head` interface, the generic model (encoder + head), the Monte Carlo
        predictive (Eq. 11) and what several heads share (prototype heads, sampled
        prototypes, chunked scoring).
    registry: every method by name; a method's config and model are built here.
    regrab: the REGRAB head (graph prior, Langevin posterior) and its no-prior ablation.
    proto: the prototype baselines ``proto`` and ``mtb``.
    proto_label: prototypes pulled towards an encoding of the relation's name.
    maml, versa, bmaml, gnn, snail, pair: the paper's comparison methods.
    floor: the untrained encoder, the floor every trained method should beat.
"""
