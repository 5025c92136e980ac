"""TracIn results carry the model's own prediction for each test triple: its score and the filtered rank of its
tail, equal to an independent computation with the model, and whether the triple is itself a training triple
(then it is one of its own candidates, marked where it is listed, its influence on itself its self-influence)."""

from __future__ import annotations

import pytest
import torch

from models.kg.checkpoint import load, save_checkpoint, write_model_dir
from models.kg.influence import FilterSpec, predictions, tracin_report
from models.kg.train import FilterIndex, TrainConfig, build_model, filtered_ranks
from models.kg.triples import load_nations


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A small ConvE on Nations with one checkpoint, untrained (a prediction is the model's, whatever it
    learned); BatchNorm in eval mode with its initial statistics."""
    out = tmp_path_factory.mktemp("conve-context")
    ds = load_nations()
    cfg = TrainConfig(embedding_dim=20, embedding_height=4, num_filters=4, seed=3)
    torch.manual_seed(cfg.seed)
    model = build_model(ds, cfg).eval()
    ckpt = save_checkpoint(model, out / "checkpoints" / "epoch-1.safetensors", 1, 0.01)
    write_model_dir(out, model, ds, [ckpt], {"lr": 0.01}, {})
    return load(out, "cpu")


def _brute_rank(bundle, h: int, r: int, t: int) -> float:
    """Filtered rank of t for (h, r) by a plain loop over the entities and the known triples."""
    with torch.no_grad():
        s = bundle.model(torch.tensor([h]), torch.tensor([r]))[0].float()
    known = {(int(a), int(b), int(c)) for a, b, c in bundle.dataset.all_known().tolist()}
    higher = ties = 0
    for e in range(len(s)):
        if e == t or (h, r, e) in known:
            continue
        higher += bool(s[e] > s[t])
        ties += bool(s[e] == s[t])
    return 1.0 + higher + 0.5 * ties


def test_score_and_filtered_rank_equal_an_independent_computation(bundle) -> None:
    ds = bundle.dataset
    test = torch.cat([ds.test[:6], ds.train[:2]])
    preds = predictions(bundle, test, batch_size=3)  # several batches
    with torch.no_grad():
        logits = bundle.model(test[:, 0], test[:, 1]).float()
    c = bundle.model.config
    # training's own metric code: the first len(test) queries are the tail queries
    ranks = filtered_ranks(bundle.model, test, FilterIndex(ds.all_known(), c.num_relations, c.reciprocal))[:len(test)]
    for i, (p, (h, r, t)) in enumerate(zip(preds, test.tolist(), strict=True)):
        assert p["score"] == pytest.approx(float(logits[i, t]), abs=1e-6)
        assert p["rank"] == float(ranks[i]) == _brute_rank(bundle, h, r, t)
        assert p["n_entities"] == len(ds.entities)


def test_a_training_triple_is_flagged_and_marked_as_its_own_candidate(bundle) -> None:
    ds = bundle.dataset
    train_triple = ds.decode(ds.train[:1])[0]
    test_triple = ds.decode(ds.test[:1])[0]
    assert tuple(test_triple) not in {tuple(t) for t in ds.decode(ds.train)}
    result, _ = tracin_report(bundle, [train_triple, test_triple], top_k=None, layers="last",
                              filter=FilterSpec(n_hops=1))
    first, second = result["results"]
    assert first["in_train"] is True and "train" in first["prediction"]["splits"]
    assert second["in_train"] is False and second["prediction"]["splits"] == ["test"]
    # it is one of its own candidates: marked where listed, its influence on itself its self-influence
    own = [p for p in first["proponents"] + first["opponents"] if p.get("is_test_triple")]
    assert [p["train_triple"] for p in own] == [train_triple]
    assert own[0]["influence"] == pytest.approx(first["self_influence"], rel=1e-4)
    assert not any(p.get("is_test_triple") for p in second["proponents"] + second["opponents"])
