r"""Occlusion (Zeiler & Fergus 2014) over token positions.

For each real position i, :math:`\mathrm{occ}_i = F(x) - F(x_{i \leftarrow x'_i})`: the score drop when position
i's embedding is replaced by the baseline's. Unlike IG it is not complete: :math:`\sum_i \mathrm{occ}_i` need not
equal :math:`F(x) - F(x')` (the report still states the gap). All occluded copies of a chunk of samples are
scored in one batched forward.
"""

from __future__ import annotations

import torch

from models.explain.ig import ForwardFn, IGResult, evaluate_fp32


@torch.no_grad()
def occlusion(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, mask: torch.Tensor,
              max_rows: int = 1024) -> IGResult:
    """``inputs``/``baselines`` ``(N, L, D)``, ``mask`` ``(N, L)`` (1 = position to occlude). Returns an
    :class:`IGResult` whose ``attributions`` are ``(N, L, 1)`` score drops (``n_steps`` = number of forwards)."""
    n, length = inputs.shape[:2]
    inputs, baselines = inputs.float(), baselines.float()
    scores = evaluate_fp32(forward, inputs)
    base_scores = evaluate_fp32(forward, baselines)
    pairs = mask.nonzero(as_tuple=False)  # (P, 2): sample, position
    drops = torch.zeros(n, length, dtype=torch.float64)
    for s in range(0, pairs.shape[0], max_rows):
        p = pairs[s:s + max_rows]
        x = inputs[p[:, 0]].clone()
        ar = torch.arange(p.shape[0], device=x.device)
        x[ar, p[:, 1]] = baselines[p[:, 0], p[:, 1]]
        out = forward(x, p[:, 0].to(x.device)).double().cpu()
        drops[p[:, 0].cpu(), p[:, 1].cpu()] = scores[p[:, 0].cpu()] - out
    return IGResult(drops.float().unsqueeze(-1), scores, base_scores, int(pairs.shape[0]) + 2, "occlusion")
