import pytest
import torch

from model.posterior.logits import gaussian_sample_logits, projected_logits, prototype_logits


@pytest.mark.parametrize("similarity", ["dot", "euclidean"])
def test_projected_logits_equal_the_logits_of_full_samples(similarity):
    # For each query build the D-dimensional z from the parts the projected logits see (its
    # coordinates in the means' span, along the query's own direction, and a remainder of
    # the given squared norm orthogonal to both): scoring mean + std z must give the same.
    torch.manual_seed(7)
    b, s, q, n, d = 3, 4, 5, 2, 16
    x = torch.randn(b, q, d, dtype=torch.float64)
    mean = torch.randn(b, n, d, dtype=torch.float64)
    std = torch.rand(b, n, 1, dtype=torch.float64) + 0.1
    basis = torch.linalg.qr(mean.transpose(1, 2)).Q  # (B, D, N)
    coords = torch.randn(b, s, n, n, dtype=torch.float64)
    along = torch.randn(b, s, n, dtype=torch.float64)
    rest = torch.rand(b, s, n, dtype=torch.float64) * d
    w = torch.randn(b, s, n, d, dtype=torch.float64)
    fast = projected_logits(x, mean, std, basis, coords, along, rest, similarity, 2.5)
    assert fast.shape == (b, s, q, n)
    for i in range(q):
        own = x[:, i] - (x[:, i, None] @ basis @ basis.transpose(1, 2))[:, 0]  # (B, D)
        u = own / own.norm(dim=-1, keepdim=True)
        frame = torch.cat([basis, u[..., None]], -1)[:, None]  # (B, 1, D, N + 1)
        perp = w - (w @ frame) @ frame.transpose(-1, -2)  # (B, S, N, D)
        perp = perp * (rest / perp.square().sum(-1)).sqrt()[..., None]
        z = coords @ basis.transpose(1, 2)[:, None] + along[..., None] * u[:, None, None] + perp
        full = prototype_logits(x[:, i:i + 1], mean[:, None] + std[:, None] * z, similarity, 2.5)
        assert torch.allclose(fast[:, :, i:i + 1], full, atol=1e-9)
    # Mutation check: without the remainder's norm the euclidean logits are wrong.
    if similarity == "euclidean":
        assert not torch.allclose(fast, projected_logits(x, mean, std, basis, coords, along,
                                                         0 * rest, similarity, 2.5))


def test_gaussian_sample_logits_have_the_law_of_scored_samples():
    torch.manual_seed(8)
    b, q, n, d, s = 2, 3, 2, 12, 40000
    x = torch.randn(b, q, d, dtype=torch.float64)
    mean = torch.randn(b, n, d, dtype=torch.float64)
    std = torch.tensor([0.5, 1.5], dtype=torch.float64).expand(b, n)[..., None]
    fast = gaussian_sample_logits(x, mean, std, s, "euclidean", 2.0,
                                  torch.Generator().manual_seed(0))
    z = torch.randn(b, s, n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    full = prototype_logits(x, mean[:, None] + std[:, None] * z, "euclidean", 2.0)
    assert fast.shape == full.shape == (b, s, q, n)
    # Per query: the means, spreads, correlations between ways and the predictive agree.
    for stat in (lambda t: t.mean(1), lambda t: t.std(1),
                 lambda t: torch.softmax(t, -1).mean(1),
                 lambda t: (t[..., 0] * t[..., 1]).mean(1)):
        assert torch.allclose(stat(fast), stat(full), rtol=0.03, atol=0.03)
    # The same seed gives the same logits, and a query's do not depend on the other queries.
    again = gaussian_sample_logits(torch.cat([torch.randn_like(x), x], 1), mean, std, s,
                                   "euclidean", 2.0, torch.Generator().manual_seed(0))
    assert torch.allclose(fast, again[:, :, q:], rtol=0, atol=1e-12)
    # Means and one query direction filling all of D: nothing to save, the caller draws.
    assert gaussian_sample_logits(x, mean, std, 3, "euclidean", 2.0).shape == (b, 3, q, n)
    assert gaussian_sample_logits(x[..., :3], mean[..., :3], std, 3, "euclidean", 2.0) is None
