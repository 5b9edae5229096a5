"""The posterior over prototypes and how prototypes score queries (paper Eq. 7-11).

Modules:
    target: the posterior target as pure functions: its gradient, its closed-form Gaussian,
        the evidence, the empirical-Bayes scales, the chain's start and one SGLD step.
    config: the posterior and sampler settings (:class:`LangevinConfig`), a schema that
        imports no torch.
    langevin: the sampler (:class:`LangevinSampler`).
    cost: what one episode's chain costs on this machine, measured.
    logits: similarities of query encodings with prototypes, cheap draws of a Gaussian
        sample's logits, and the shift to the posterior predictive.
    shots: ways with unequal shots: a padded support with per-way counts, scored in one call,
        and the prototype baselines' fair scores of it.
    suspicion: how unlikely a support sentence's label is given the rest of the support
        (leave-one-out posterior predictive, or a leave-one-out prototype).
"""
