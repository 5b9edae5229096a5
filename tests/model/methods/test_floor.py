import numpy as np
import torch

from model.methods.base import PrototypeHead
from model.methods.floor import CosinePrototypeHead


def test_floor_is_cosine_to_the_renormalised_prototype():
    g = torch.Generator().manual_seed(0)
    support, query = torch.randn(4, 3, 5, 8, generator=g), torch.randn(4, 6, 8, generator=g)
    logits = CosinePrototypeHead(1.0).sample_logits(support, query)
    assert logits.shape == (4, 1, 6, 3)
    s, q = support.double().numpy(), query.double().numpy()
    for b in range(4):
        for n in range(3):
            unit = s[b, n] / np.linalg.norm(s[b, n], axis=1, keepdims=True)
            proto = unit.mean(0)
            for i in range(6):
                cos = q[b, i] @ proto / (np.linalg.norm(q[b, i]) * np.linalg.norm(proto))
                assert abs(logits[b, 0, i, n].item() - cos) < 1e-5


def test_scattered_shots_are_not_penalised_for_their_spread():
    # Way 0: two shots 90 degrees apart around direction (1, 1); way 1: two identical shots.
    support = torch.tensor([[[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                             [[0.6, 0.0, 0.8], [0.6, 0.0, 0.8]]]])
    query = torch.nn.functional.normalize(torch.tensor([[[1.0, 1.0, 0.9]]]), dim=-1)
    # The query is closer in angle to way 0 (cos 0.84 vs 0.79), but the mean of way 0's unit
    # shots has norm 0.71, so the un-renormalised dot product picks way 1.
    unit = torch.nn.functional.normalize(support, dim=-1)
    old = PrototypeHead("dot", 1.0).log_predictive(unit, query)
    assert old.argmax(-1).item() == 1
    assert CosinePrototypeHead(1.0).log_predictive(support, query).argmax(-1).item() == 0
