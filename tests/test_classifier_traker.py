"""TRAK on classifiers agrees with the ``traker`` package (MadryLab's TRAK, 0.3.2) on the same model, projection and
checkpoints. traker computes its own per-example gradients (``torch.func`` over its image-classification margin),
its own Gauss-Newton inverse and its own Q weights; only the projection is shared (a traker projector that applies
explainq's projection matrix of each checkpoint, ``model_id`` i being checkpoint i, so the random sketch is not a
difference). Both average Q (``1 - p``) over the checkpoints, each at its own weights (the TRAK paper's Algorithm 1).

What differs by convention, and nothing else (the last test reproduces traker's numbers from explainq's functions
with these two conventions):

1. traker divides each model's ``(XᵀX + λI)⁻¹`` by the mean absolute value of its entries (for float16 storage),
   a positive scalar per checkpoint: one checkpoint's scores are scaled, several checkpoints are weighted
   differently in the average;
2. traker takes one absolute ``lambda_reg`` for every checkpoint; explainq a damping relative to each checkpoint's
   mean eigenvalue (``damping · tr(ΦᵀΦ)/k``).

With one checkpoint and the same λ the two are proportional (rank correlation 1); over several checkpoints the
rank correlation is printed and bounded below.
"""

from __future__ import annotations

import pytest
import torch

from models.export.demo import DIGITS_LABELS, digits_arrays, digits_program
from models.export.program import build, load
from models.export.train import Split, save_model, train
from models.training import TrainOptions

SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}
K, DAMPING, SEED = 64, 0.05, 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from models.export.influence import ProgramModule, classifier, read_checkpoints, rows

    tmp = tmp_path_factory.mktemp("traker")
    init = digits_program(tmp / "init")
    exported = build(init / "model.pt2", SPEC)
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0][:80]), torch.tensor(a["train"][1][:80]))
    save_model(tmp / "out", exported, train(exported, data, TrainOptions(epochs=3, batch_size=32, lr=0.05,
                                                                         checkpoint_every=1)))
    module = ProgramModule(load(tmp / "out"))
    clf = classifier(module, read_checkpoints(tmp / "out", module).states)
    test_x, test_y = torch.tensor(a["test"][0][:6]), torch.tensor(a["test"][1][:6])
    yield clf, (data.inputs, data.labels), (test_x, test_y), rows(test_x, test_y), rows(data.inputs, data.labels), tmp
    torch.set_num_threads(threads)


def _shared_projector(clf, positions):
    """A traker projector applying explainq's projection matrix (Kronecker blocks per parameter, seeded) of the
    checkpoint at ``positions[model_id]`` among the classifier's checkpoints."""
    from trak.projectors import AbstractProjector

    from models.explain.trak import checkpoint_seed, projection_matrix

    shapes = {n: tuple(p.shape) for n, p in clf.module.named_parameters()}
    matrices = [projection_matrix(shapes, K, checkpoint_seed(SEED, c), dtype=torch.float32) for c in positions]

    class Shared(AbstractProjector):
        def __init__(self):
            super().__init__(matrices[0].shape[0], K, SEED, "normal", "cpu")

        def project(self, grads, model_id):
            if isinstance(grads, dict):  # traker's per-parameter gradients, flattened as its BasicProjector does
                from trak.utils import vectorize

                grads = vectorize(grads, device="cpu")
            return grads.float() @ matrices[model_id]

        def free_memory(self):
            pass

    return Shared()


def _lambdas(clf, checkpoints, train_rows):
    """explainq's λ_c = damping · tr(Φ_cᵀΦ_c)/k per checkpoint (the same features traker computes)."""
    from models.explain.classifier_estimators import _projector, checkpoint_index
    from models.explain.trak import checkpoint_seed, damping_of, gram_of

    out = []
    for ck in checkpoints:
        proj = _projector(clf, "trak", K, checkpoint_seed(SEED, checkpoint_index(clf, ck)), None, 64)
        proj.load(ck)
        out.append(damping_of(gram_of(proj.features(train_rows)), DAMPING))
    return out


def _traker(clf, checkpoints, train_xy, test_xy, tmp, lambda_reg: float, name: str):
    """TRAKer's scores ``[tests, train]`` over ``checkpoints`` (model ids in order)."""
    from trak import TRAKer

    n = len(train_xy[0])
    positions = [next(i for i, c in enumerate(clf.checkpoints) if c is ck) for ck in checkpoints]
    traker = TRAKer(model=clf.at(clf.checkpoints[-1]), task="image_classification", train_set_size=n,
                    projector=_shared_projector(clf, positions), proj_dim=K, save_dir=str(tmp / name), device="cpu",
                    use_half_precision=False, lambda_reg=lambda_reg, logging_level=40)
    for i, ck in enumerate(checkpoints):
        traker.load_checkpoint(ck.state_dict(), model_id=i)
        traker.featurize(batch=train_xy, num_samples=n)
    traker.finalize_features()
    for i, ck in enumerate(checkpoints):
        traker.start_scoring_checkpoint(exp_name="q", checkpoint=ck.state_dict(), model_id=i,
                                        num_targets=len(test_xy[0]))
        traker.score(batch=test_xy, num_samples=len(test_xy[0]))
    return torch.as_tensor(traker.finalize_scores(exp_name="q")).t().double()


def _spearman(a, b):
    from scipy.stats import spearmanr

    return float(spearmanr(a.reshape(-1).numpy(), b.reshape(-1).numpy()).statistic)


def test_one_checkpoint_with_the_same_damping_is_proportional_to_traker(trained):
    from models.explain.classifier_estimators import trak_scores

    clf, train_xy, test_xy, test, train_rows, tmp = trained
    last = clf.checkpoints[-1:]
    (lam,) = _lambdas(clf, last, train_rows)
    mine = trak_scores(clf, last, test, train_rows, proj_dim=K, damping=DAMPING, seed=SEED)
    # traker divides its features by sqrt(#parameters): the same λ in its units is λ / #parameters
    params = sum(p.numel() for p in clf.module.parameters())
    theirs = _traker(clf, last, train_xy, test_xy, tmp, lam / params, "one")
    scale = float((mine * theirs).sum() / (theirs * theirs).sum())
    assert scale > 0
    torch.testing.assert_close(theirs * scale, mine, rtol=1e-3, atol=1e-4 * float(mine.abs().max()))
    rho = _spearman(mine, theirs)
    print(f"TRAK vs traker, one checkpoint: Spearman {rho:.5f}")
    assert rho >= 0.999


def test_every_checkpoint_agrees_with_traker_in_rank(trained):
    """Three checkpoints with each side's own conventions (module docstring): printed, and >= 0.998 here."""
    from models.explain.classifier_estimators import trak_scores

    clf, train_xy, test_xy, test, train_rows, tmp = trained
    lams = _lambdas(clf, clf.checkpoints, train_rows)
    params = sum(p.numel() for p in clf.module.parameters())
    mine = trak_scores(clf, "all", test, train_rows, proj_dim=K, damping=DAMPING, seed=SEED)
    theirs = _traker(clf, clf.checkpoints, train_xy, test_xy, tmp, sum(lams) / len(lams) / params, "all")
    rho = _spearman(mine, theirs)
    per_test = [_spearman(mine[i], theirs[i]) for i in range(len(mine))]
    print(f"TRAK vs traker, {len(clf.checkpoints)} checkpoints: Spearman {rho:.4f} overall, per test example "
          f"min {min(per_test):.4f}")
    assert rho >= 0.998, (rho, per_test)


def test_tra_kers_conventions_reproduce_its_scores_exactly(trained):
    """explainq's features and solve with traker's two conventions give traker's numbers: nothing else differs."""
    from models.explain.classifier_estimators import _projector, trak_weights
    from models.explain.trak import checkpoint_seed

    clf, train_xy, test_xy, test, train_rows, tmp = trained
    lam = 1e-4
    params = sum(p.numel() for p in clf.module.parameters())
    theirs = _traker(clf, clf.checkpoints, train_xy, test_xy, tmp, lam, "conventions")
    total = torch.zeros(len(test), len(train_rows), dtype=torch.float64)
    q = torch.zeros(len(train_rows), dtype=torch.float64)
    for c, ck in enumerate(clf.checkpoints):
        proj = _projector(clf, "trak", K, checkpoint_seed(SEED, c), None, 64)
        proj.load(ck)
        phi, phi_t = proj.features(train_rows).double() / params ** 0.5, proj.features(test).double() / params ** 0.5
        inv = torch.linalg.inv(phi.t() @ phi + lam * torch.eye(K, dtype=torch.float64))
        inv = inv / inv.abs().mean()                       # convention 1
        total += phi_t @ inv @ phi.t()
        q += trak_weights(clf, train_rows, ck)             # Q at each checkpoint, as explainq's
    want = total / len(clf.checkpoints) * (q / len(clf.checkpoints))[None]
    torch.testing.assert_close(theirs, want, rtol=2e-3, atol=2e-4 * float(want.abs().max()))
