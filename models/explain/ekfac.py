r"""Influence functions with EK-FAC curvature, computed by Kronfluence (Grosse et al. 2023, "Studying Large Language
Model Generalization with Influence Functions"; the library: ``kronfluence``), on any :class:`Classifier`.

.. math::

    \mathrm{score}(z_{test}, z) = \nabla_\theta f(z_{test})^\top (G + \lambda I)^{-1} \nabla_\theta \ell(z)

with ``G`` the EK-FAC approximation of the Gauss–Newton Hessian of the training loss at the trained weights (the
last checkpoint), fitted by Kronfluence on the training examples (per layer: the covariances of the layer's inputs
and of its output gradients with labels sampled from the model, their eigenvectors, then the eigenvalue
correction), ``ℓ`` the cross-entropy and ``f`` the test-side output: the negated classification margin (default;
what Kronfluence's own classification examples measure) or the loss. Every number is Kronfluence's: this module
only states the model and data to it (a ``Task``: the summed training loss of a batch of rows, the summed
measurement) and reads its scores; a positive score says the training example lowered ``f`` (helped the test
prediction), as for TracIn and TRAK here.

Kronfluence covers the model's ``nn.Linear`` and ``nn.Conv2d`` modules (every other parameter is outside the
scores, as in Kronfluence itself); the classifier's ``layered`` view gives it those modules (an exported program's
``aten.linear``/``aten.conv2d`` calls as real modules, a Hugging Face model's ``Conv1D`` as ``nn.Linear``). A
classifier without one has ``kfac_problem`` set and :class:`NotSupported` is raised before any work.

Self-influence (mislabel detection) is Kronfluence's ``compute_self_scores``: ∇ℓ(z)ᵀ(G + λI)⁻¹∇ℓ(z), the loss on
both sides. Damping λ: Kronfluence's heuristic (0.1 × the mean eigenvalue of each layer) unless ``damping`` is
given (then that number, Kronfluence's ``damping_factor``). The factors are fitted once per call into a
temporary directory (``workdir``) that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.explain.classifier import Classifier, check_output, last

DEFAULT_BATCH = 64
QUERY_BYTES = 1 << 30  # preconditioned query gradients held at once (fp32, every covered parameter per query)


class NotSupported(ValueError):
    """The classifier has no layer Kronfluence covers (the reason is the message)."""


def _rows_dataset(rows: torch.Tensor) -> torch.utils.data.Dataset:
    return _Rows(rows)


class _Rows(torch.utils.data.Dataset):
    """Rows as a dataset: each item one row, batches ``[B, ...]``."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


def _task_class() -> type:
    from kronfluence.task import Task

    class ClassifierTask(Task):
        """The classifier stated to Kronfluence: a batch is a ``[B, ...]`` tensor of rows."""

        def __init__(self, clf: Classifier, output: str, seed: int) -> None:
            super().__init__()
            self.clf, self.output = clf, output
            self.generator = torch.Generator().manual_seed(int(seed))

        def _logits(self, batch: torch.Tensor, model: nn.Module) -> torch.Tensor:
            return model(*self.clf.inputs(batch)).float()

        def compute_train_loss(self, batch: torch.Tensor, model: nn.Module, sample: bool = False) -> torch.Tensor:
            logits = self._logits(batch, model)
            if not sample:
                labels = self.clf.labels(batch).to(logits.device)
            else:  # the true Fisher: labels drawn from the model's own predictive distribution (seeded)
                with torch.no_grad():
                    probs = torch.softmax(logits.detach().cpu().double(), -1)
                    labels = torch.multinomial(probs, 1, generator=self.generator).flatten().to(logits.device)
            return nn.functional.cross_entropy(logits, labels, reduction="sum")

        def compute_measurement(self, batch: torch.Tensor, model: nn.Module) -> torch.Tensor:
            logits = self._logits(batch, model)
            labels = self.clf.labels(batch).to(logits.device)
            if self.output == "loss":
                return nn.functional.cross_entropy(logits, labels, reduction="sum")
            own = torch.arange(logits.shape[-1], device=logits.device) == labels[:, None]
            margins = logits.gather(1, labels[:, None])[:, 0] - logits.masked_fill(own, float("-inf")).logsumexp(-1)
            return -margins.sum()

        def get_attention_mask(self, batch: torch.Tensor) -> torch.Tensor | None:
            return None if self.clf.token_mask is None else self.clf.token_mask(batch)

    return ClassifierTask


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Kronfluence's INFO logs and torch's GradScaler deprecation warnings stay out of the job's log; the objects
    that exist before the call are frozen for the garbage collector meanwhile (Kronfluence calls ``gc.collect()``
    between its passes, which otherwise walks every object of the process each time: measured 0.76 s a call in a
    worker with transformers loaded, most of a small model's run)."""
    logger = logging.getLogger("kronfluence")
    before = logger.level
    logger.setLevel(logging.WARNING)
    gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        gc.unfreeze()
        logger.setLevel(before)


class EKFAC:
    """Kronfluence's analyzer on one classifier at its trained weights (the last checkpoint), with the factors
    fitted on ``train`` (:meth:`fit`), scoring pairs (:meth:`scores`) and self-influence (:meth:`self_scores`).
    ``device``: where it computes (CPU unless a CUDA device is given). Use as a context manager: the factors'
    directory is removed on exit."""

    def __init__(self, clf: Classifier, *, output: str = "margin", damping: float | None = None,
                 batch_size: int = DEFAULT_BATCH, device: torch.device | str = "cpu", seed: int = 0,
                 workdir: str | Path | None = None) -> None:
        check_output(output)
        if clf.kfac_problem is not None or clf.layered is None:
            raise NotSupported(clf.kfac_problem or "the classifier has no layered view for Kronfluence")
        if damping is not None and not (damping >= 0 and damping == damping and damping != float("inf")):
            raise ValueError(f"damping must be a finite number >= 0 or None, got {damping}")
        self.clf, self.output, self.damping, self.seed = clf, output, damping, int(seed)
        self.batch_size = max(1, int(batch_size))
        self.device = torch.device(device)
        self._dir = Path(tempfile.mkdtemp(prefix="ekfac-", dir=workdir))
        self._fitted = False
        self._n = 0

    def __enter__(self) -> EKFAC:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def _analyzer(self, output: str) -> Any:
        from kronfluence.analyzer import Analyzer, prepare_model

        model = self.clf.layered(self.clf.at(last(self.clf.checkpoints), self.device))
        task = _task_class()(self.clf, output, self.seed)
        model = prepare_model(model, task)
        tracked = {n: m for n, m in model.named_modules() if type(m).__name__.startswith("Tracked")}
        self.covered = list(tracked)
        self.covered_parameters = sum(p.numel() for m in tracked.values() for p in m.parameters())
        if not self.covered:
            raise NotSupported("Kronfluence found no nn.Linear or nn.Conv2d layer in the model")
        return Analyzer("explainq", model, task, cpu=self.device.type == "cpu", disable_tqdm=True,
                        output_dir=str(self._dir))

    def fit(self, train: torch.Tensor) -> EKFAC:
        """Fit the EK-FAC factors on the training rows ``train`` (Kronfluence's ``fit_all_factors``)."""
        from kronfluence.arguments import FactorArguments

        with _quiet():
            self._an = self._analyzer(self.output)
            self._an.fit_all_factors("factors", _rows_dataset(train), per_device_batch_size=self.batch_size,
                                     factor_args=FactorArguments(strategy="ekfac"), overwrite_output_dir=True)
        self._fitted, self._n = True, len(train)
        return self

    def _score_args(self, **kw: Any) -> Any:
        from kronfluence.arguments import ScoreArguments

        return ScoreArguments(damping_factor=self.damping, **kw)

    def query_batch(self, n_test: int) -> int:
        """Test examples whose preconditioned gradients are held at once (``QUERY_BYTES``)."""
        covered = sum(p.numel() for p in self.clf.module.parameters())
        return max(1, min(n_test, QUERY_BYTES // max(1, 4 * covered)))

    def scores(self, test: torch.Tensor, train: torch.Tensor, name: str = "pairwise") -> torch.Tensor:
        """``[m, n]``: Kronfluence's pairwise scores of the training rows ``train`` on the test rows ``test``
        (float32, CPU)."""
        if not self._fitted:
            raise RuntimeError("fit the factors first")
        if len(test) == 0 or len(train) == 0:
            return torch.zeros(len(test), len(train))
        with _quiet():
            self._an.compute_pairwise_scores(name, "factors", _rows_dataset(test), _rows_dataset(train),
                                             per_device_query_batch_size=self.query_batch(len(test)),
                                             per_device_train_batch_size=self.batch_size,
                                             score_args=self._score_args(), overwrite_output_dir=True)
            out = self._an.load_pairwise_scores(name)["all_modules"]
        return out.float().cpu()

    def self_scores(self, train: torch.Tensor, name: str = "self") -> torch.Tensor:
        """``[n]``: Kronfluence's self-influence of each training row (the loss on both sides)."""
        if not self._fitted:
            raise RuntimeError("fit the factors first")
        if len(train) == 0:
            return torch.zeros(0)
        with _quiet():
            self._an.compute_self_scores(name, "factors", _rows_dataset(train),
                                         per_device_train_batch_size=self.batch_size,
                                         score_args=self._score_args(), overwrite_output_dir=True)
            out = self._an.load_self_scores(name)["all_modules"]
        return out.float().cpu()


def ekfac_scores(clf: Classifier, test: torch.Tensor, train: torch.Tensor, *, output: str = "margin",
                 damping: float | None = None, batch_size: int = DEFAULT_BATCH, device: torch.device | str = "cpu",
                 seed: int = 0) -> torch.Tensor:
    """``[m, n]`` EK-FAC influence of ``train`` on ``test`` (module docstring): the factors fitted on ``train``."""
    with EKFAC(clf, output=output, damping=damping, batch_size=batch_size, device=device, seed=seed) as ek:
        return ek.fit(train).scores(test, train)


def ekfac_self_scores(clf: Classifier, train: torch.Tensor, *, damping: float | None = None,
                      batch_size: int = DEFAULT_BATCH, device: torch.device | str = "cpu",
                      seed: int = 0) -> torch.Tensor:
    """``[n]`` EK-FAC self-influence of each training row, the factors fitted on ``train``."""
    with EKFAC(clf, damping=damping, batch_size=batch_size, device=device, seed=seed) as ek:
        return ek.fit(train).self_scores(train)
