"""TracIn with Adam's update direction (``tracin_adam``, models/kg/tracin_adam.py): the Adam state saved with the
checkpoints, the estimator against a float64 reference built from a plain loop of ``torch.autograd.grad``, its
reduction to scaled TracIn when the moments are zero and ε is large, and the error on a checkpoint without state."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

from models.kg import evaluation
from models.kg.checkpoint import load, load_adam_state
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ConvE trained with Adam for 3 epochs on 120 Nations triples, checkpoints with their Adam state."""
    ds = load_nations()
    ds = evaluation.with_train(ds, ds.train[:120], keep_eval=True)
    cfg = TrainConfig(epochs=3, batch_size=32, lr=0.01, embedding_dim=8, embedding_height=2, num_filters=2,
                      input_dropout=0.0, feature_dropout=0.0, hidden_dropout=0.0, checkpoint_every=1, seed=3)
    out = tmp_path_factory.mktemp("adam-model")
    summary = train_conve(ds, cfg, out, device="cpu", optimizer_state=True)
    return out, summary


def _reference(bundle, test, train, output):
    """Σ_c η_c ⟨∇f(test), Γ_c(∇ℓ(train))⟩ in float64: one torch.autograd.grad call per example, the losses written
    out (1-N BCE with label smoothing over both queries; the negated margin of the tail query), Γ from the state."""
    model = copy.deepcopy(bundle.model).double().eval()
    c = model.config
    params = list(model.parameters())
    n_ent = c.num_entities

    def train_loss(trip):
        total = torch.zeros((), dtype=torch.float64)
        h, r, t = (int(x) for x in trip)
        for qh, qr, qt in ((h, r, t), (t, r + c.num_relations, h)):
            s = model(torch.tensor([qh]), torch.tensor([qr]))[0]
            y = torch.full((n_ent,), 1.0 / n_ent, dtype=torch.float64)
            y[qt] += 1.0 - c.label_smoothing
            bce = torch.clamp(s, min=0) - s * y + torch.log1p(torch.exp(-s.abs()))
            total = total + bce.mean()
        return total

    def margin_loss(trip):
        h, r, t = (int(x) for x in trip)
        s = model(torch.tensor([h]), torch.tensor([r]))[0]
        others = torch.cat([s[:t], s[t + 1:]])
        return torch.logsumexp(others, 0) - s[t]

    def flat_grad(loss):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    total = torch.zeros(len(test), len(train), dtype=torch.float64)
    selfs = torch.zeros(len(train), dtype=torch.float64)
    for ck in bundle.checkpoints:
        model.load_state_dict(ck.state_dict("cpu"))
        model.double().eval()
        st = load_adam_state(ck, "tracin_adam")
        names = [n for n, _ in model.named_parameters()]
        m = torch.cat([st.exp_avg[n].reshape(-1) for n in names]).double()
        v = torch.cat([st.exp_avg_sq[n].reshape(-1) for n in names]).double()
        t = st.step + 1
        test_f = margin_loss if output == "margin" else train_loss
        gt = torch.stack([flat_grad(test_f(z)) for z in test])
        gb = torch.stack([flat_grad(train_loss(z)) for z in train])
        m_hat = (st.beta1 * m + (1 - st.beta1) * gb) / (1 - st.beta1 ** t)
        v_hat = (st.beta2 * v + (1 - st.beta2) * gb ** 2) / (1 - st.beta2 ** t)
        u = m_hat / (v_hat.sqrt() + st.eps)
        total += ck.lr * gt @ u.t()
        selfs += ck.lr * (gb * u).sum(1)
    return total.numpy(), selfs.numpy()


def test_checkpoints_keep_the_adam_state_when_asked_and_old_ones_still_load(trained, tmp_path):
    out, summary = trained
    bundle = load(out)
    steps_per_epoch = 120 // 32 + 1
    assert [c.epoch for c in bundle.checkpoints] == [1, 2, 3]
    for ck in bundle.checkpoints:
        assert ck.optimizer is not None and ck.optimizer.name == f"{ck.path.stem}.adam.safetensors"
        st = load_adam_state(ck, "tracin_adam")
        assert st.step == steps_per_epoch * ck.epoch and (st.beta1, st.beta2, st.eps) == (0.9, 0.999, 1e-8)
        assert set(st.exp_avg) == set(st.exp_avg_sq) == {n for n, _ in bundle.model.named_parameters()}
        assert all(bool((x >= 0).all()) for x in st.exp_avg_sq.values())
    assert all("optimizer" in c for c in summary["checkpoints"])
    # without the option (POST /train/conve's models), weights only, as before
    plain = train_conve(bundle.dataset, TrainConfig(epochs=1, embedding_dim=8, embedding_height=2, num_filters=2),
                        tmp_path / "plain", device="cpu")
    assert "optimizer" not in plain["checkpoints"][0]
    assert not list((tmp_path / "plain" / "checkpoints").glob("*.adam.safetensors"))
    assert load(tmp_path / "plain").checkpoints[0].optimizer is None


def test_tracin_adam_equals_a_float64_autograd_loop(trained):
    bundle = load(trained[0])
    test, train = bundle.dataset.test[:3], bundle.dataset.train[:12]
    for output in ("margin", "loss"):
        got = evaluation.run_estimator("tracin_adam", bundle, test, train, output=output).values
        want, want_self = _reference(bundle, test, train, output)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert evaluation.output_of("tracin_adam") == "margin"
    got_self = evaluation.run_estimator("tracin_adam", bundle, None, train, self_scores=True).values
    np.testing.assert_allclose(got_self, want_self, rtol=1e-5, atol=1e-5 * np.abs(want_self).max())
    assert (got_self > 0).all()  # ⟨g, Γ(g)⟩ > 0 once the moments agree with g in sign often enough
    # the update is not the gradient: the scores are not a multiple of TracIn's
    plain = evaluation.run_estimator("tracin", bundle, test, train).values
    ratio = got / plain
    assert np.ptp(ratio) > 0.1 * np.abs(ratio).mean()


def test_the_memory_blocks_do_not_change_the_scores(trained, monkeypatch):
    """Test triples in groups of 2 and training triples in blocks of 5 give the scores of one block each."""
    from models.kg import tracin_adam

    bundle = load(trained[0])
    test, train = bundle.dataset.test[:3], bundle.dataset.train[:12]
    whole = evaluation.run_estimator("tracin_adam", bundle, test, train).values
    n_params = sum(p.numel() for p in bundle.model.parameters())
    monkeypatch.setattr(tracin_adam, "TEST_NUMBERS", 2 * n_params)
    monkeypatch.setattr(tracin_adam, "BLOCK_NUMBERS", 5 * n_params)
    blocked = evaluation.run_estimator("tracin_adam", bundle, test, train).values
    # float32 sums in another order: equal to float32's rounding of the largest score, not to a fixed 1e-9 (a
    # CPU with other kernels, AVX-512 against AVX2, rounds each block's sum differently)
    np.testing.assert_allclose(blocked, whole, rtol=1e-5, atol=1e-6 * np.abs(whole).max())


def _rewrite_state(bundle, eps: float) -> None:
    """Replace each checkpoint's Adam moments by zeros and its ε by ``eps`` (step and betas kept)."""
    for ck in bundle.checkpoints:
        with safe_open(str(ck.optimizer), framework="pt") as fh:
            meta = dict(fh.metadata())
        tensors = {k: torch.zeros_like(v) for k, v in load_file(str(ck.optimizer)).items()}
        save_file(tensors, str(ck.optimizer), metadata={**meta, "eps": repr(eps)})


def test_zero_moments_and_a_large_eps_reduce_tracin_adam_to_scaled_tracin(trained, tmp_path):
    import shutil

    work = tmp_path / "model"
    shutil.copytree(trained[0], work)
    bundle = load(work)
    eps = 1e4
    _rewrite_state(bundle, eps)
    test, train = bundle.dataset.test[:4], bundle.dataset.train[:30]
    got = evaluation.run_estimator("tracin_adam", bundle, test, train).values
    # m = v = 0: Γ(g) = (1 − β1) g / (1 − β1^t) / (√((1 − β2) g² / (1 − β2^t)) + ε) ≈ (1 − β1) g / ((1 − β1^t) ε),
    # with t = step + 1 at each checkpoint: TracIn with η_c scaled by (1 − β1) / ((1 − β1^t_c) ε)
    states = [load_adam_state(c, "tracin_adam") for c in bundle.checkpoints]
    scale = [(1 - s.beta1) / ((1 - s.beta1 ** (s.step + 1)) * eps) for s in states]
    from models.kg.tracin import ConvETracIn

    want = sum(ConvETracIn(bundle.model, [c], weights=[c.lr * k]).output_influence(test, train).double().numpy()
               for c, k in zip(bundle.checkpoints, scale, strict=True))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    # with one checkpoint the reduction is exactly TracIn times the scale
    one = evaluation.tracin_adam_scores(bundle, bundle.checkpoints[-1:], test, train).numpy()
    only = evaluation.tracin_scores(bundle, bundle.checkpoints[-1:], test, train).numpy()
    np.testing.assert_allclose(one, scale[-1] * only, rtol=1e-4, atol=1e-6 * np.abs(one).max())
    assert np.abs(got).max() > 0


def test_a_checkpoint_without_adam_state_is_a_clear_error_naming_the_estimator(trained, tmp_path):
    import shutil

    work = tmp_path / "old"
    shutil.copytree(trained[0], work)
    cfg = json.loads((work / "config.json").read_text())
    for c in cfg["checkpoints"]:  # a model directory written before the state was kept
        c.pop("optimizer")
    (work / "config.json").write_text(json.dumps(cfg))
    for f in (work / "checkpoints").glob("*.adam.safetensors"):
        f.unlink()
    bundle = load(work)
    test, train = bundle.dataset.test[:2], bundle.dataset.train[:5]
    with pytest.raises(ValueError, match=r"estimator 'tracin_adam' needs the Adam state .* checkpoint 'epoch_0001'"):
        evaluation.run_estimator("tracin_adam", bundle, test, train)
    with pytest.raises(ValueError, match="estimator 'tracin_adam' needs the Adam state"):
        evaluation.run_estimator("tracin_adam", bundle, None, train, self_scores=True)
    assert evaluation.run_estimator("tracin", bundle, test, train).values.shape == (2, 5)  # the others still run
