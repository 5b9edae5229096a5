"""Logits of queries against prototypes, and against Gaussian samples of them.

:func:`similarity_logits` scores sentences against one set of prototypes, and
:func:`prototype_logits` against S sampled sets at once. :func:`gaussian_sample_logits` draws
the logits of S Gaussian samples ``v = mean + std z`` without drawing the D-dimensional
samples (what REGRAB's predictive does at evaluation; :mod:`model.posterior.langevin`), and
:func:`predictive_shift` centres them on the Gaussian posterior predictive.

Shapes:
    B episodes, S samples, N ways, Q queries, D encoding size.
"""

from __future__ import annotations

import torch


def similarity_logits(
    x: torch.Tensor, v: torch.Tensor, similarity: str, temperature: float
) -> torch.Tensor:
    """Softmax logits ``sim(x, v) / T`` of every sentence against every prototype.

    Shapes:
        x: (..., Q, D), v: (..., N, D) -> (..., Q, N)
    """
    if similarity == "dot":
        sim = x @ v.transpose(-1, -2)
    else:
        sim = -0.5 * (
            (x * x).sum(-1, keepdim=True)
            - 2 * x @ v.transpose(-1, -2)
            + (v * v).sum(-1).unsqueeze(-2)
        )
    return sim / temperature


def prototype_logits(x: torch.Tensor, v: torch.Tensor, similarity: str,
                     temperature: float) -> torch.Tensor:
    """``similarity_logits(x[:, None], v, ...)`` for S prototype sets at once.

    The same numbers, computed with one matrix product per episode: the broadcast product
    copies x once per sample, which made evaluation batches (250 episodes) ten times slower.
    REGRAB, Versa and BMAML score their samples with it.

    Shapes:
        x: (B, Q, D), v: (B, S, N, D) -> (B, S, Q, N)
    """
    b, s, n, d = v.shape
    dot = (x @ v.reshape(b, s * n, d).transpose(1, 2)).view(b, -1, s, n)  # (B, Q, S, N)
    dot = dot.transpose(1, 2)  # (B, S, Q, N)
    if similarity == "dot":
        return dot / temperature
    sq_x = (x * x).sum(-1)[:, None, :, None]  # (B, 1, Q, 1)
    sq_v = torch.linalg.vector_norm(v, dim=-1).square()[:, :, None, :]  # (B, S, 1, N)
    return -0.5 * (sq_x - 2 * dot + sq_v) / temperature


def projected_logits(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                     basis: torch.Tensor, coords: torch.Tensor, along: torch.Tensor,
                     rest: torch.Tensor, similarity: str, temperature: float) -> torch.Tensor:
    """Logits of each query against ``v = mean + std z``, given the parts of z it can see.

    ``basis`` (orthonormal) spans the means; ``coords`` are z's coordinates in it, ``along``
    its coordinate along the query's own direction outside that span, and ``rest`` its
    squared norm outside both. ``x . v`` and ``||v||^2`` need nothing else, so each query's
    logits are exactly those of such a sample ``v``.

    Shapes:
        x: (B, Q, D), mean: (B, N, D), std: (B, N, 1), basis: (B, D, K),
        coords: (B, S, N, K), along, rest: (B, S, N) -> (B, S, Q, N)
    """
    xb = x @ basis  # (B, Q, K)
    off = torch.linalg.vector_norm(x - xb @ basis.transpose(1, 2), dim=-1)  # (B, Q)
    vb = torch.addcmul((mean @ basis)[:, None], std[:, None], coords)  # (B, S, N, K)
    sd = std[:, None, None, :, 0]  # (B, 1, 1, N)
    g = along[:, :, None, :]  # (B, S, 1, N)
    dot = prototype_logits(xb, vb, "dot", 1.0) + off[:, None, :, None] * sd * g
    if similarity == "dot":
        return dot / temperature
    sq_x = (x * x).sum(-1)[:, None, :, None]  # (B, 1, Q, 1)
    sq_v = (torch.linalg.vector_norm(vb, dim=-1).square()[:, :, None, :]
            + sd.square() * (g.square() + rest[:, :, None, :]))  # (B, S, Q, N)
    return -0.5 * (sq_x - 2 * dot + sq_v) / temperature


def gaussian_sample_logits(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                           samples: int, similarity: str, temperature: float,
                           generator: torch.Generator | None = None) -> torch.Tensor | None:
    """Logits of the queries under S draws ``v = mean + std z``, ``z ~ N(0, I_D)``, per way.

    A query's logits see z only through its N coordinates in the span of the N means, its
    coordinate along the query's own direction outside that span, and (``euclidean``) its
    squared norm outside both, chi-squared with D - N - 1 degrees of freedom. Drawing those
    (N + 2 numbers per sample and way instead of D) gives each query's logits exactly the law
    they have under scoring full samples: at evaluation (S = 50, D = 768) drawing and scoring
    full samples was most of REGRAB's time. The draws are shared by the queries, so they do
    not depend on the queries at all (a query gets the same logits in any batch), but they
    couple the queries differently than one D-dimensional sample would (each query's own
    direction is another): every predictive, confidence and mutual information is a
    per-query quantity, exact under this. Returns None when the means and a query direction
    fill all of D.

    Shapes:
        x: (B, Q, D), mean: (B, N, D), std: (B, N, 1) -> (B, S, Q, N)
    """
    b, n, d = mean.shape
    if n + 1 >= d:
        return None
    basis = torch.linalg.qr(mean.transpose(1, 2)).Q  # (B, D, N)
    kw = {"generator": generator, "device": x.device, "dtype": x.dtype}
    coords = torch.randn((b, samples, n, n), **kw)
    dof = torch.full((b, samples, n), 0.5 * (d - n - 1), device=x.device, dtype=x.dtype)
    rest = 2.0 * torch._standard_gamma(dof, generator=generator)  # chi^2, D - N - 1 dof
    along = torch.randn((b, samples, n), **kw)
    return projected_logits(x, mean, std, basis, coords, along, rest, similarity, temperature)


def predictive_shift(query: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                     variance: float, temperature: float, dims: float = 1.0) -> torch.Tensor:
    """What moves each way's expected sample logit to its posterior predictive.

    A sample ``v ~ N(m_r, s_r^2 I)`` scores a query ``-|q - v|^2 / 2T``, whose mean over
    samples is ``-(|q - m_r|^2 + D s_r^2) / 2T``: the way's uncertainty is a penalty. Under the
    Gaussian model a query of way r is ``N(m_r, (sigma^2 + s_r^2) I)``; its log density,
    scaled by ``sigma^2 / T`` (so a way known exactly, s_r = 0, scores ``-|q - m_r|^2 / 2T`` as
    a point estimate would), is

        g_r(q) = -(sigma^2 / T) (|q - m_r|^2 / (2 (sigma^2 + s_r^2)) + D/2 log(sigma^2 + s_r^2)).

    ``dims`` scales the D of the log term: real encodings scatter in far fewer than D
    directions (isotropic sigma^2 is their mean over all D), and counting every dimension
    there charges a way with fewer shots more than its queries' distances say.

    The shift ``g_r(q) + (|q - m_r|^2 + D s_r^2) / 2T`` added to every sample's logits makes
    their mean ``g_r(q)`` and keeps their spread.

    Shapes:
        query: (B, Q, D), mean: (B, N, D), std: (B, N, 1) -> (B, 1, Q, N)
    """
    d = query.shape[-1]
    dist = (-2.0 * similarity_logits(query, mean, "euclidean", 1.0))  # |q - m|^2: (B, Q, N)
    s2 = std[..., 0].square()[:, None, :]  # (B, 1, N)
    wide = variance + s2
    g = -(variance / temperature) * (dist / (2.0 * wide) + 0.5 * dims * d * torch.log(wide))
    return (g + (dist + d * s2) / (2.0 * temperature))[:, None]
