"""The TRAK configuration the attribution-quality evaluations run and docs/quality.md measured (torch-free).

One source for three readers: the evaluation's ``trak`` estimator (:func:`models.kg.evaluation.trak_scores` passes
exactly :func:`trak_configuration` to :func:`models.kg.trak.trak_scores`), the defaults of ``POST /featurize`` and of
``POST /tracin`` with ``estimator: "trak"`` (``core.kinds``, which must not import torch), and the ``configuration``
a stored-feature result names (:func:`models.kg.stored.run_configuration`).

TRAK as the paper defines its features: gradients of the output function (``margin``, the multi-class margin of the
tail query that the LDS measures) on both sides, projected to k dimensions by the seeded Kronecker projection, a
damped Gauss-Newton inverse per checkpoint with λ = ``TRAK_DAMPING`` · tr(ΦᵀΦ)/k, averaged over every checkpoint, on
every layer. The damping was chosen on Nations (m=16); the projection size on development replicates (seeds 1000
and 1001, never the measured seeds): k=4096 raised Kinships' LDS from 0.35 to 0.45 and UMLS's from 0.48 to 0.52,
and left Nations' unchanged (docs/quality.md). k is halved, down to ``TRAK_MIN_PROJ_DIM``, while the training
triples' [n, k] float32 features would exceed ``TRAK_MAX_FEATURE_BYTES``, so a large graph keeps its memory bounded.
"""

from __future__ import annotations

from typing import Any

TRAK_PROJ_DIM = 4096
TRAK_MIN_PROJ_DIM = 256
TRAK_MAX_FEATURE_BYTES = 2 << 30
TRAK_DAMPING = 0.3
TRAK_LOSS = "margin"          # the gradients projected, on both sides
TRAK_SEED = 0                 # the projection's seed
TRAK_CHECKPOINTS = "all"      # averaged with equal weights
TRAK_LAYERS = "all"
TRAK_PROJECTION = "kronecker"  # models.explain.trak.KroneckerProjector.projection


def trak_proj_dim(n_train: int) -> int:
    """The projection size TRAK uses for ``n_train`` training triples: ``TRAK_PROJ_DIM``, halved down to
    ``TRAK_MIN_PROJ_DIM`` while ``n_train`` float32 rows of k numbers would pass ``TRAK_MAX_FEATURE_BYTES``."""
    k = TRAK_PROJ_DIM
    while k > TRAK_MIN_PROJ_DIM and 4 * k * max(int(n_train), 1) > TRAK_MAX_FEATURE_BYTES:
        k //= 2
    return k


def trak_configuration(n_train: int) -> dict[str, Any]:
    """The TRAK configuration the evaluations run and docs/quality.md measured, for ``n_train`` training triples
    (every checkpoint, every layer, the margin on both sides, k from :func:`trak_proj_dim`, ``TRAK_DAMPING``,
    projection seed 0, the Kronecker projection). ``POST /tracin``'s ``trak`` results name it beside the
    configuration they ran, and the served defaults are it."""
    return {"checkpoints": TRAK_CHECKPOINTS, "layers": TRAK_LAYERS, "loss": TRAK_LOSS,
            "projection_dim": trak_proj_dim(n_train), "damping": TRAK_DAMPING, "seed": TRAK_SEED,
            "projection": TRAK_PROJECTION}


def stored_configuration(n_train: int) -> dict[str, Any]:
    """What of :func:`trak_configuration` the stored features fix (everything but the damping, which a query
    applies): the features ``POST /featurize`` stores by default, for ``n_train`` training triples."""
    return {k: v for k, v in trak_configuration(n_train).items() if k != "damping"}
