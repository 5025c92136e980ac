"""The per-step running-loss curve: bounded, shown from the first steps, equal to the plain computation, recorded
by the ConvE, news and Vision-BDH training loops; the curve colours' one definition, shared with the SDK."""

from __future__ import annotations

import random

import pytest

from core.contract import charts as kinds_base
from core.contract.kind import KINDS
from core.contract.kind import load_kinds as load_all
from models.curves import StepCurve, reference_rows


def _feed(curve: StepCurve, losses: list[tuple[float, float]], steps_per_epoch: int) -> None:
    for i, (s, w) in enumerate(losses, 1):
        curve.add(i, s, w, force=i % steps_per_epoch == 0)


@pytest.mark.parametrize("n_steps,per_epoch,max_points", [(1, 5, 8), (7, 5, 8), (1000, 37, 50), (5000, 5000, 64)])
def test_points_are_bounded_and_equal_the_reference_means(n_steps, per_epoch, max_points) -> None:
    rng = random.Random(n_steps)
    losses = [(rng.uniform(0.1, 3.0) * (w := rng.randint(1, 64)), float(w)) for _ in range(n_steps)]
    curve = StepCurve(per_epoch, max_points)
    _feed(curve, losses, per_epoch)
    rows = curve.rows()
    assert 1 <= len(rows) <= max_points + 1  # the points and the pending window
    ends = [r["step"] for r in rows]
    assert ends == sorted(set(ends)) and ends[-1] == n_steps
    ref = reference_rows(losses, ends, per_epoch)
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in ref]
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in ref], rel=1e-12)


def test_first_steps_show_before_an_epoch_ends() -> None:
    curve = StepCurve(steps_per_epoch=100, max_points=200)
    for step in range(1, 4):
        curve.add(step, 2.0 * step, 1.0)
    assert [(r["step"], r["loss"]) for r in curve.rows()] == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert curve.rows()[0]["epoch"] == 0.01


def test_device_reads_stay_bounded_on_a_long_run() -> None:
    """A loop reads its loss only when a point is due: a few hundred reads per run, not one per step."""
    curve, reads = StepCurve(steps_per_epoch=1000, max_points=200), 0
    for step in range(1, 100_001):
        last = step % 1000 == 0
        if last or curve.due(step):
            reads += 1
            curve.add(step, 1.0, 1.0, force=last)
    assert len(curve.points) <= 200
    assert reads < 2_000  # about max_points · (1 + ½ log2(steps / max_points)) + one per epoch


def test_state_round_trip_and_refusals() -> None:
    curve = StepCurve(10, 8)
    _feed(curve, [(1.0, 1.0)] * 45, 10)
    again = StepCurve.from_state(curve.state(), 10, 8)
    assert again.rows() == curve.rows()[:-1] and again.stride == curve.stride  # the pending window is not kept
    assert StepCurve.from_state(curve.state(), 11, 8).rows() == []  # another batch size: a new curve
    with pytest.raises(ValueError, match="not after"):
        curve.add(3, 1.0, 1.0)
    with pytest.raises(ValueError):
        StepCurve(0)


@pytest.mark.slow
def test_conve_training_records_a_bounded_step_curve(tmp_path) -> None:
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_nations

    progress_steps: list[int] = []
    cfg = TrainConfig(epochs=2, batch_size=64, embedding_dim=20, embedding_height=4, num_filters=4,
                      checkpoint_every=2)
    ds = load_nations()
    per_epoch = -(-len(ds.train) // 64)
    curve = StepCurve(per_epoch, max_points=8)

    def progress(done, total, message, metrics):
        if metrics is None and not progress_steps:
            progress_steps.append(len(curve.rows()))  # the curve shows before the first epoch ends

    summary = train_conve(ds, cfg, tmp_path, device="cpu", progress=progress, curve=curve)
    assert progress_steps == [1]
    steps = summary["steps"]
    assert steps == curve.rows() and 2 <= len(steps) <= 9 and steps[-1]["epoch"] == 2.0
    # the points' weighted mean over the run is the epochs' mean loss (each point weighs its examples)
    total = sum(s for _, s, _ in curve.points) / sum(w for _, _, w in curve.points)
    assert total == pytest.approx(sum(h["loss"] for h in summary["history"]) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="steps per epoch"):
        train_conve(ds, cfg, tmp_path / "x", device="cpu", curve=StepCurve(per_epoch + 1))


def test_train_colours_are_one_definition_for_the_dashboard_and_the_sdk() -> None:
    from explainq_client import render

    assert render.TRAIN_COLOUR == kinds_base.TRAIN_COLOUR
    assert render.VALIDATION_COLOUR == kinds_base.VALIDATION_COLOUR
    assert tuple(render.OTHER_COLOURS) == kinds_base.OTHER_COLOURS
    load_all()
    cases = [[s[0] for s in c["series"]] for k in KINDS.values() for c in k.charts]
    cases += [["train_loss", "val_loss"], ["val_accuracy", "train_accuracy"], ["loss", "valid.mrr", "valid.mr"],
              ["valid_mrr", "valid_hits@1", "valid_hits@10"], ["lr"], [], ["training_loss", "validation_loss"]]
    for keys in cases:
        assert render.series_colours(keys) == kinds_base.series_colours(keys), keys
    # and what clients are given: GET /kinds' series carry their colour
    bdh = KINDS["train_bdh"].describe()["charts"]
    loss = next(c for c in bdh if c["id"] == "loss")
    assert loss["series"] == [["train_loss", "train loss", "#0072B2"], ["val_loss", "validation loss", "#D55E00"]]
    steps = next(c for c in bdh if c["id"] == "steps")
    assert steps["rows"] == "steps" and steps["series"][0][2] == kinds_base.TRAIN_COLOUR
    for kind in ("train_bdh", "train_conve", "train_news"):
        d = KINDS[kind].describe()
        assert d["renderer"] == "training" and d["live_rows"] == "history" and d["charts"][0]["id"] == "steps"


def test_sdk_draws_train_and_validation_in_the_shared_colours_and_the_step_curve() -> None:
    from explainq_client import render

    history = [{"epoch": 1, "train_loss": 1.0, "val_loss": 1.2}, {"epoch": 2, "train_loss": 0.8, "val_loss": 1.1}]
    steps = [{"step": 1, "epoch": 0.5, "loss": 1.4}, {"step": 2, "epoch": 1.0, "loss": 1.1}]
    html = render.curves_html(history, "run", steps)
    assert "running loss by step" in html
    assert f"stroke='{kinds_base.TRAIN_COLOUR}' stroke-width='2' points=" in html
    assert html.index("<title>train_loss</title>") > html.index(f"stroke='{kinds_base.TRAIN_COLOUR}'")
    val = html.index("<title>val_loss</title>")
    assert html.rfind(f"stroke='{kinds_base.VALIDATION_COLOUR}'", 0, val) > html.rfind("<title>train_loss</title>", 0, val)
    live = render.job_html({"id": "x", "kind": "train_bdh", "status": "running", "metrics": {"history": [],
                                                                                          "steps": steps}})
    assert "running loss by step" in live  # before the first epoch ends


def test_bdh_models_get_a_readable_name_made_unique_when_taken(redis_settings, tmp_path) -> None:
    from core import registry
    from core.kinds.train_bdh import TrainBDHRequest
    from workers.jobs.train_bdh import default_model_name

    class Ctx:
        settings, owner = redis_settings, "alice"
        job_id = "0123456789abcdef0123456789abcdef"

    ctx = Ctx()
    digits, cifar10 = TrainBDHRequest(dataset="digits"), TrainBDHRequest(dataset="cifar10")
    assert default_model_name(ctx, digits) == "bdh-digits-01234567"
    label = TrainBDHRequest(dataset="cifar10", label="  wide run / lr 3e-3 ✓  ")
    assert default_model_name(ctx, label) == "bdh-wide-run-lr-3e-3-01234567"
    for given in ("bdh-tiny", "BDH_tiny", "bdh-bdh-tiny", " bdh - tiny "):
        assert default_model_name(ctx, TrainBDHRequest(dataset="digits", label=given)) == "bdh-tiny-01234567", given
    assert default_model_name(ctx, TrainBDHRequest(dataset="digits", label="bdh")) == "bdh-bdh-01234567"
    assert default_model_name(ctx, TrainBDHRequest(dataset="digits", label="bdhx")) == "bdh-bdhx-01234567"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    registry.register_model(redis_settings, "bdh-digits-01234567", kind="vision_bdh", loader="x:y",
                            path=tmp_path / "m", owner="bob")  # another owner's: the full id
    assert default_model_name(ctx, digits) == f"bdh-digits-{ctx.job_id}"
    registry.register_model(redis_settings, "bdh-cifar10-01234567", kind="vision_bdh", loader="x:y",
                            path=tmp_path / "m", owner="alice", meta={"job_id": ctx.job_id})  # this job's own
    assert default_model_name(ctx, cifar10) == "bdh-cifar10-01234567"


def test_live_metrics_are_written_at_a_bounded_rate() -> None:
    from workers.live import LiveMetrics

    curve = StepCurve(10)
    curve.add(1, 2.0, 1.0)
    live = LiveMetrics(ctx=None, interval_s=3600)
    first = live.metrics([], curve, epoch=1)
    assert first == {"epoch": 1, "history": [], "steps": curve.rows()}
    assert live.metrics([], curve) is None  # within the interval: no meta write
    assert live.metrics([{"epoch": 1}], curve, force=True)["history"] == [{"epoch": 1}]  # an epoch's end


@pytest.mark.slow
def test_news_training_records_its_step_curve_with_the_announced_steps_per_epoch(tmp_path) -> None:
    from models.news.data import read_split
    from models.news.modules import build_model
    from models.news.text import WordTokenizer
    from models.news.train import TrainConfig, steps_per_epoch, train
    from tests.byo_fixtures import mind_dir

    split = read_split(mind_dir(tmp_path / "mind"), "train")
    tokenizer = WordTokenizer.build([n.title for n in split.news.values()])
    model = build_model({"kind": "nrms", "encoder": "word", "emb_dim": 16, "heads": 2, "head_dim": 8,
                         "query_dim": 16, "dropout": 0.0, "max_title_len": 16}, tokenizer)
    cfg = TrainConfig(epochs=2, batch_size=8)
    per_epoch = steps_per_epoch(split, cfg.batch_size, cfg.max_history)
    seen: list[int] = []
    curve = StepCurve(per_epoch)
    result = train(model, split, None, cfg, progress=lambda step, total, m: seen.append(len(curve.rows())),
                   curve=curve)
    assert seen[0] == 1 and len(seen) == 2 * per_epoch  # a point from the first step on
    assert result["steps"][-1] == {"step": 2 * per_epoch, "epoch": 2.0, "loss": pytest.approx(
        result["steps"][-1]["loss"])}
    first_epoch = [r for r in result["steps"] if r["epoch"] <= 1.0]
    assert first_epoch[-1]["epoch"] == 1.0  # a point closes each epoch
