"""The posterior over prototypes and how prototypes score queries (paper Eq. 7-11).

Modules:
    target: the posterior target as pure functions: its gradient, its closed-form Gaussian,
        the evidence and the empirical-Bayes scales.
    langevin: the posterior and sampler settings (:class:`LangevinConfig`), one SGLD step and
        the sampler around it (:class:`LangevinSampler`).
    logits: similarities of query encodings with prototypes, and cheap draws of a Gaussian
        sample's logits.
    suspicion: how unlikely a support sentence's label is given the rest of the support
        (leave-one-out posterior predictive, or a leave-one-out prototype).
"""
