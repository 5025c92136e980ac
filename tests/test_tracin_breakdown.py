"""Each listed TracIn score's breakdown: per checkpoint and per layer group, computed where the score is, adding up
to the score (to 1e-6), each part equal to an independent TracIn run over that checkpoint or those layers alone;
and the test triple's own copy and its reverse flagged in the lists."""

from __future__ import annotations

import pytest
import torch

from models.kg.influence import add_predictions, tracin_report
from models.kg.tracin import ConvETracIn, layer_groups
from tests.test_tracin import bundle  # noqa: F401 (the tiny trained ConvE fixture)


def _listed(result: dict) -> list[tuple[dict, dict]]:
    return [(entry, pair) for entry in result["results"] for key in ("proponents", "opponents")
            for pair in entry[key]]


def test_every_listed_score_of_a_report_carries_its_breakdown_adding_up_to_it(bundle) -> None:  # noqa: F811
    ds = bundle.dataset
    result, _ = tracin_report(bundle, ds.decode(ds.test[:1]), top_k=3, loss="score_bce", batch_size=256)
    listed = _listed(result)
    entry = result["results"][0]
    assert len(listed) == len(entry["proponents"]) + len(entry["opponents"]) >= 3
    for _, pair in listed:
        b = pair["breakdown"]
        assert len(b["checkpoints"]) == len(result["checkpoints"]) == 3
        assert sum(b["checkpoints"]) == pytest.approx(pair["influence"], abs=1e-6)
        assert sum(b["layers"].values()) == pytest.approx(pair["influence"], abs=1e-6)
    assert list(listed[0][1]["breakdown"]["layers"]) == [
        "entity table", "relation table", "convolution and batch norm", "fully connected", "entity bias"]


@pytest.mark.parametrize(("method", "layers"), [
    ("ghost", "all"), ("ghost", "last"),
    pytest.param("vmap", ["fc", "conv", "rel"], marks=pytest.mark.slow),  # about 16 s: materialised gradients
])
def test_each_part_equals_tracin_over_that_checkpoint_or_those_layers_alone(bundle, method, layers) -> None:  # noqa: F811
    ds = bundle.dataset
    test, train = ds.test[:1], ds.train[:5]
    engine = ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, method=method, batch_size=4)
    scores, _ = engine.influence(test, train)
    per_ck, per_group, labels = engine.breakdown(test.expand(len(train), 3), train)
    assert torch.allclose(per_ck.sum(1), scores[0].double(), atol=1e-6, rtol=0)
    assert torch.allclose(per_group.sum(1), scores[0].double(), atol=1e-6, rtol=0)
    for c, (ckpt, w) in enumerate(zip(bundle.checkpoints, engine.weights, strict=True)):
        alone, _ = ConvETracIn(bundle.model, [ckpt], layers=layers, method=method, weights=[w]).influence(test, train)
        assert torch.allclose(per_ck[:, c], alone[0].double(), atol=1e-7, rtol=1e-5), (c, per_ck[:, c], alone[0])
    for g, (label, members) in enumerate(layer_groups(engine.names)):
        assert labels[g] == label
        alone, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers=list(members), method=method).influence(
            test, train)
        assert torch.allclose(per_group[:, g], alone[0].double(), atol=1e-7, rtol=1e-5), (label, per_group[:, g])


def test_the_test_triple_itself_and_its_reverse_are_flagged() -> None:
    entry = {"test_triple": ["usa", "embassy", "uk"],
             "proponents": [{"train_triple": ["usa", "embassy", "uk"]}, {"train_triple": ["uk", "embassy", "usa"]},
                            {"train_triple": ["uk", "treaties", "usa"]}],
             "opponents": [{"train_triple": ["uk", "embassy", "usa"]}]}
    add_predictions([entry], [{"splits": ["train"]}])
    flags = [(p.get("is_test_triple", False), p.get("is_reverse", False)) for p in entry["proponents"]]
    assert flags == [(True, False), (False, True), (False, False)]
    assert entry["opponents"][0]["is_reverse"] and entry["in_train"]


def _with_breakdown() -> dict:
    """The crafted two-test-triple TracIn result (tests/analysis_pages.py) with a breakdown on every listed pair
    of the first test triple: two checkpoints, two layer groups, each adding up to the influence."""
    from core.contract.results.influence import InfluenceResult
    from tests.analysis_pages import tracin_result

    result = tracin_result()
    result["checkpoints"] = [{"name": "e1", "epoch": 1, "lr": 0.01, "weight": 0.01},
                             {"name": "e2", "epoch": 2, "lr": 0.005, "weight": 0.005}]
    first = result["results"][0]
    for key in ("proponents", "opponents"):
        for p in first[key]:
            v = p["influence"]
            p["breakdown"] = {"checkpoints": [0.75 * v, 0.25 * v],
                              "layers": {"entity table": 1.5 * v, "fully connected": -0.5 * v}}
    return InfluenceResult.model_validate(result).model_dump(mode="json")


def test_the_job_page_flags_the_reverse_and_tabulates_the_breakdown() -> None:
    import re

    from tests.analysis_pages import job_page

    page = job_page(_with_breakdown(), kind="tracin")
    first = page.split('<article class="test-triple">')[1]
    assert first.count("the test triple itself") == 1 and first.count("the test triple reversed") == 1
    table = re.search(r'<table class="compact breakdown">(.*?)</table>', first, re.S).group(1)
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert heads == ["#", "training triple", "influence", "checkpoint e1", "checkpoint e2", "entity table",
                     "fully connected"]
    assert "+0.0111" in table and "−0.0074" in table  # 0.75 × 0.0148, −0.5 × 0.0148
    second = page.split('<article class="test-triple">')[2]
    assert "breakdown" not in second  # no listed pair of it has one


def test_the_sdk_gives_the_breakdown_and_flags_as_text_html_and_a_data_frame() -> None:
    from explainq_client import TracInResult

    result = TracInResult(_with_breakdown(), "tracin", "InfluenceResult")
    text = result.text()
    assert "[the test triple reversed]" in text and "[the test triple itself]" in text
    assert "where each score comes from" in text and "checkpoint e2" in text
    assert "the test triple reversed" in result._repr_html_()
    frame = result.to_pandas("breakdown")
    assert len(frame) == 5 * 4  # 3 proponents + 2 opponents, 2 checkpoints + 2 groups each
    sums = frame.groupby(["role", "rank", "part"])["value"].sum()
    influence = frame.groupby(["role", "rank", "part"])["influence"].first()
    assert (sums - influence).abs().max() < 1e-12
    assert bool(result.to_pandas().is_reverse.any())
