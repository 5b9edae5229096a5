"""Posterior and sampler settings (``params.yaml`` section ``model.langevin``).

The schema alone, without the sampler: it imports no torch, so the params checks
(``check_params``, the flow's ``-S`` overrides) read it in a fraction of a second; the module
doc of :mod:`model.posterior.langevin` says what each setting does to the chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config import field

Likelihood = Literal["gaussian", "softmax", "softmax_mean"]


@dataclass(frozen=True)
class LangevinConfig:
    """Posterior and sampler settings (``params.yaml`` section ``model.langevin``).

    Attributes:
        samples: S posterior samples (paper: 10).
        steps: Langevin steps (paper: 5).
        step_size: eps (paper: 0.1).
        step_decay: eps is multiplied by this after every step (1.0 = constant; the authors'
            code used 0.01, which freezes the chain after the first step).
        init_prior_weight: a in ``m_r + a * h_r - b * m``.
        init_mean_weight: b in the same formula.
        temperature: T; query logits are ``sim / T`` (and the softmax likelihoods' too).
        similarity: ``dot`` (paper) or ``euclidean`` (``-||x - v||^2 / 2``, appendix C).
        likelihood: ``gaussian``, ``softmax`` or ``softmax_mean`` (see the module doc).
        prior_precision: lambda of ``N(v_r | h_r, lambda^-1 I)`` (the initial value unless
            ``scales`` is ``fixed``). 0 is a flat prior (the graph has no say); it needs
            ``scales: fixed``, since log 0 cannot be learned or estimated, and any other
            ``scales`` is refused rather than silently treated as fixed.
        likelihood_variance: sigma^2 of the ``gaussian`` likelihood (likewise; unused by the
            softmax likelihoods).
        scales: ``fixed`` (the two numbers above), ``learned`` (log lambda and log sigma^2
            trained end to end by the few-shot loss) or ``heldout``: empirical Bayes on
            relations the model is not trained on, re-estimated from the validation
            relations at every validation (:func:`~model.posterior.target.heldout_scales`),
            so lambda says how well the prior predicts *unseen* relations, which is what test
            relations are.
        prior_trust: ``fixed`` (every way's prior has precision lambda) or ``evidence``: per
            episode, empirical Bayes on its support (:func:`way_precision`). Under the model
            a way's support mean satisfies ``E |m_r - h_r|^2 / D = 1/lambda + sigma^2/K``; an
            episode whose supports fall farther from their prior means than that gets the
            prior variance they imply, so priors that point at the wrong relations are
            discounted by the evidence rather than trusted as in training. The softmax
            likelihoods keep lambda (the estimate needs the Gaussian model).
            Without shots there is no evidence and lambda stays. ``checked``: the evidence
            rule, and at evaluation the episode's precision times the probability that its
            priors name its ways (:mod:`model.posterior.prior_check`); training is as
            ``evidence``.
        noise_train: add the SGLD noise during training.
        noise_eval: add it at evaluation (off: S collapses to one deterministic chain and
            the predictive is a point estimate, not a posterior average).
        eval_samples: S at evaluation and prediction (0: ``samples``). Training needs few
            samples for its gradient; the predictive of a scored episode is a Monte Carlo
            average, and more samples estimate the same average with less noise (REGRAB's
            chains and Versa's draws; BMAML's interacting particles stay ``samples``).
        predictive, predictive_dims: REGRAB's scores at evaluation and prediction
            (:func:`~model.posterior.logits.predictive_shift`, docs/model.md#unequal-shots).
        prototype_scoring, balanced_members: the prototype baselines' and maml, versa and
            bmaml's scores of unequal shots (:mod:`model.posterior.shots`).
    """

    samples: int = field(ge=1, le=10_000,
                         doc="S posterior samples per episode in training, averaged by the "
                             "predictive (paper: 10)")
    steps: int = field(ge=0, doc="Langevin steps (paper: 5)")
    step_size: float = field(ge=0, doc="eps; preconditioned, so 1 halves the distance to the mean "
                                       "in a step (paper: 0.1)")
    step_decay: float = field(ge=0, doc="eps is multiplied by this after every step (1 = "
                                        "constant; the authors' code decayed it 100x)")
    init_prior_weight: float = field(doc="a in the starting point v0 = m_r + a h_r - b m (paper: "
                                         "1)")
    init_mean_weight: float = field(doc="b in the same formula (paper: 1; subtracting m distorts "
                                        "Euclidean distances)")
    temperature: float = field(gt=0, doc="T of the query softmax: logits are sim / T (paper: 10)")
    similarity: Literal["dot", "euclidean"] = field(doc="dot (the paper's default) or euclidean "
                                                        "(-||x - v||^2 / 2, the paper's appendix)")
    likelihood: Likelihood = field(doc="gaussian (summed over shots), softmax (paper Eq. 7) or "
                                       "softmax_mean")
    prior_precision: float = field(ge=0, doc="lambda of N(v_r | h_r, I / lambda), the initial "
                                             "value unless scales is fixed; 0 is a flat prior and "
                                             "needs scales: fixed")
    likelihood_variance: float = field(gt=0, doc="sigma^2 of the gaussian likelihood x ~ N(v_y, "
                                                 "sigma^2 I), the initial value unless scales is "
                                                 "fixed")
    scales: Literal["fixed", "learned", "heldout"] = field(
        doc="fixed (the two numbers above), learned (by the few-shot loss) or heldout (empirical "
            "Bayes on the validation relations at every validation)")
    prior_trust: Literal["fixed", "evidence", "checked"] = field(
        doc="fixed: every way's prior has precision lambda (paper); evidence: an episode whose "
            "support means fall farther from their h_r than lambda and sigma^2 predict gets a "
            "wider prior, 1/lambda_e = max(1/lambda, mean_r |m_r - h_r|^2 / D - sigma^2 / K), "
            "so priors that point at the wrong relations are discounted (with the gaussian "
            "likelihood; the softmax ones keep lambda); checked: evidence, and at evaluation "
            "lambda_e times P(the priors name the ways | the support's labels), the Bayes "
            "factor of the prior's zero-shot predictive of the support labels against chance")
    noise_train: bool = field(doc="add the Langevin noise during training")
    noise_eval: bool = field(doc="add it at evaluation too, so the predictive averages S samples "
                                 "(off: one deterministic chain, a point estimate)")
    eval_samples: int = field(ge=0, le=10_000,
                              doc="S at evaluation and prediction (0: samples); more "
                                  "samples estimate the same predictive average with less "
                                  "noise")

    predictive: Literal["samples", "gaussian"] = field(
        doc="REGRAB's scores at evaluation and prediction: samples (the average of the "
            "samples' softmax, a way with fewer shots pays D s^2 / 2T) or gaussian (the "
            "samples centred on the posterior predictive log N(q; m_r, (sigma^2 + s_r^2) I), "
            "scaled by sigma^2 / T: fair to ways with unequal shots)")
    predictive_dims: float = field(
        gt=0, le=1,
        doc="with predictive: gaussian, the share of the D dimensions in the predictive's "
            "-D/2 log(sigma^2 + s_r^2) term: the encodings' within-relation scatter fills "
            "far fewer than D directions, and counting all of them over-penalises a way with "
            "fewer shots (1: the isotropic model); chosen on validation relations")
    prototype_scoring: Literal["mean", "normalised", "unbiased"] = field(
        doc="how proto, mtb and proto_label score ways with unequal shots: mean (plain), "
            "normalised (each prototype at its encodings' length) or unbiased (the squared "
            "distance less its prototype's sampling noise, tr Sigma / k_r, pooled over the "
            "episode; balanced episodes score as mean)")
    balanced_members: int = field(ge=0, le=100, doc=(
        "maml, versa and bmaml on unequal shots: the average of this many fits, each with "
        "every way cut to the smallest way's count (0: oversampled to the largest count); "
        "balanced episodes score as before"))

    def draws(self, training: bool) -> int:
        """Independent samples per episode: ``samples`` in training, ``eval_samples`` (when
        set) at evaluation."""
        return self.samples if training or not self.eval_samples else self.eval_samples

    def __post_init__(self) -> None:
        if self.prior_precision == 0 and self.scales != "fixed":
            raise ValueError(
                f"prior_precision 0 (a flat prior) needs scales: fixed, not {self.scales} "
                "(log 0 has nothing to learn or estimate); set scales: fixed, or a "
                "prior_precision > 0 as the starting value"
            )
