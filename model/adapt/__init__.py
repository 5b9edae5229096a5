"""Adapting a trained model's encoder to a team's own unlabelled sentences (``regrab-adapt``).

:mod:`model.adapt.objectives` holds the ways to adapt (re-centring and whitening folded into
the top layer, contrastive learning over dropout or entity-masked views);
:mod:`model.adapt.pseudo` the self-training on the prior's labels of the sentences against a
team's named relations; :mod:`model.adapt.run` reads a checkpoint and the sentences, keeps to
the budget and writes the adapted checkpoint.
"""

from model.adapt import objectives, pseudo, run

__all__ = ["objectives", "pseudo", "run"]
