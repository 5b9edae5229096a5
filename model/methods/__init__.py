"""Every few-shot method: REGRAB and its baselines, one module each, and their registry.

Modules:
    registry: every method by name, the :class:`Head` interface their heads share.
    regrab: the REGRAB head and the Monte Carlo predictive (Eq. 11), and the generic model.
    proto: prototype baselines (proto, mtb, regrab_no_prior) and the shared prior-free heads.
    proto_label: prototypes pulled towards an encoding of the relation's name.
    maml, versa, bmaml, gnn, snail, pair: the paper's comparison methods.
    floor: the untrained encoder, the floor every trained method should beat.
"""
