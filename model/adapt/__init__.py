"""Adapting a trained model's encoder to a team's own unlabelled sentences (``regrab-adapt``).

:mod:`model.adapt.objectives` holds the ways to adapt (re-centring and whitening folded into
the top layer, contrastive learning over dropout views); :mod:`model.adapt.run` reads a
checkpoint and the sentences, keeps to the budget and writes the adapted checkpoint.
"""

from model.adapt import objectives, run

__all__ = ["objectives", "run"]
