"""The posterior over prototypes and how prototypes score queries (paper Eq. 7-11).

Modules:
    langevin: the posterior target, its closed-form Gaussian and the SGLD sampler.
    logits: similarities of query encodings with prototypes, and cheap draws of a Gaussian
        sample's logits.
"""
