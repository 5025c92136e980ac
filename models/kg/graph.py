"""In-process neighbourhood filter on an adjacency index of the training graph (no subprocesses).

The training triples are an undirected multigraph on entities. The degree of an entity is the number of training
triples it appears in (a self-loop counts once).

``candidates(seeds, n_hops, min_degree, preserve_test_entities)`` returns the training triples within ``n_hops`` of
the seed entities (a test triple's head and tail):

- an entity is *allowed* if its degree is >= ``min_degree``; with ``preserve_test_entities`` the seeds are always
  allowed. Breadth-first search from the allowed seeds moves only through allowed entities, giving the distance
  dist(e) of every reachable entity;
- a training triple (h, r, t) is kept iff h and t are both allowed and reachable, and min(dist(h), dist(t)) <= n_hops − 1,
  i.e. the triple is the k-th edge of a path from a seed for some k <= n_hops. For ``n_hops=1`` these are exactly
  the triples that touch the test head or tail.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


class AdjacencyIndex:
    """CSR adjacency (entity -> neighbouring entities) plus entity -> incident triple ids."""

    def __init__(self, triples: torch.Tensor, num_entities: int) -> None:
        t = triples.cpu().numpy().astype(np.int64)
        self.num_entities = num_entities
        self.heads = t[:, 0]
        self.tails = t[:, 2]
        src = np.concatenate([self.heads, self.tails])
        dst = np.concatenate([self.tails, self.heads])
        order = np.argsort(src, kind="stable")
        self.indptr = np.zeros(num_entities + 1, dtype=np.int64)
        np.add.at(self.indptr, src + 1, 1)
        self.indptr = np.cumsum(self.indptr)
        self.neighbours = dst[order]
        self.degree = np.zeros(num_entities, dtype=np.int64)
        np.add.at(self.degree, self.heads, 1)
        loops = self.heads == self.tails
        np.add.at(self.degree, self.tails[~loops], 1)

    def distances(self, seeds: Iterable[int], n_hops: int, allowed: np.ndarray) -> np.ndarray:
        """BFS distance from the seeds through allowed entities, up to ``n_hops`` (−1 = not reached)."""
        dist = np.full(self.num_entities, -1, dtype=np.int64)
        frontier = np.unique(np.array([s for s in seeds if allowed[s]], dtype=np.int64))
        dist[frontier] = 0
        for d in range(1, n_hops + 1):
            if len(frontier) == 0:
                break
            nbrs = np.concatenate([self.neighbours[self.indptr[e]:self.indptr[e + 1]] for e in frontier])
            nbrs = np.unique(nbrs)
            nbrs = nbrs[(dist[nbrs] < 0) & allowed[nbrs]]
            dist[nbrs] = d
            frontier = nbrs
        return dist

    def candidates(self, seeds: Iterable[int], n_hops: int = 1, min_degree: int = 0,
                   preserve_test_entities: bool = True) -> torch.Tensor:
        """Sorted training-triple indices within ``n_hops`` of ``seeds`` (see the module docstring)."""
        if n_hops < 1:
            raise ValueError("n_hops must be >= 1")
        seeds = list(seeds)
        allowed = self.degree >= min_degree
        if preserve_test_entities:
            allowed[seeds] = True
        dist = self.distances(seeds, n_hops, allowed)
        dh, dt = dist[self.heads], dist[self.tails]
        reached = (dh >= 0) & (dt >= 0)
        near = np.minimum(np.where(dh >= 0, dh, n_hops), np.where(dt >= 0, dt, n_hops)) <= n_hops - 1
        keep = reached & near & allowed[self.heads] & allowed[self.tails]
        return torch.from_numpy(np.nonzero(keep)[0])
