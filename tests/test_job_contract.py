"""The job functions of the training kinds, the model import and the ablations honour the typed job contract: each
takes its kind's validated request object and returns its kind's result model, a subclass of its renderer's model;
its module reads the request's attributes (no payload dicts, no second copy of a default); the result models write
the keys clients read (``hits@1``, ``model_config``) and the library configurations are built from every field
the request and the library share."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import get_type_hints

import pytest

from core.contract.kind import import_object, load_kinds
from core.contract.results import BY_RENDERER
from core.contract.results.base import ResultModel
from core.contract.results.training import TrainingResult

# the job modules converted to the typed contract (run(request, ctx) -> result model)
CONVERTED = ("workers.jobs.train_conve", "workers.jobs.train_bdh", "workers.jobs.train_news",
             "workers.jobs.import_model", "workers.jobs.ablations")
KINDS = {name: kind for name, kind in load_kinds().items() if kind.func.partition(":")[0] in CONVERTED}


def test_every_converted_module_runs_a_kind() -> None:
    assert {k.func.partition(":")[0] for k in KINDS.values()} == set(CONVERTED)
    assert set(KINDS) == {"train_conve", "train_bdh", "train_news", "import_model", "ablations"}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_job_function_takes_the_request_model_and_returns_the_result_model(name: str) -> None:
    kind = KINDS[name]
    func = import_object(kind.func)
    hints = get_type_hints(func)
    first = next(iter(inspect.signature(func).parameters))
    assert hints[first] is kind.request, (name, hints[first])
    assert kind.result is not None and hints["return"] is kind.result, (name, hints.get("return"))


@pytest.mark.parametrize("name", sorted(KINDS))
def test_result_model_is_a_strict_subclass_of_its_renderers_model(name: str) -> None:
    kind = KINDS[name]
    base = BY_RENDERER[kind.renderer] if kind.renderer is not None else ResultModel
    assert issubclass(kind.result, base), (name, kind.result, base)
    assert kind.result.model_config.get("extra") == "forbid", name
    assert kind.describe()["result"] == kind.result.__name__
    kind.result.model_json_schema(mode="serialization")  # the OpenAPI document can describe it
    if kind.renderer == "training":  # what the dashboard and the SDK draw any training kind from
        common = TrainingResult.model_fields
        assert {f: kind.result.model_fields[f].annotation for f in common} == \
            {f: common[f].annotation for f in common}, name


def _request_fields(module: str) -> set[str]:
    return {f for k in KINDS.values() if k.func.startswith(module + ":") for f in k.request.model_fields}


@pytest.mark.parametrize("module", CONVERTED)
def test_job_module_keeps_no_second_copy_of_a_request_default(module: str) -> None:
    """No ``x.get("<field>", default)``, no ``getattr(x, "<field>", default)`` for a field of the kind's request,
    and no ``payload`` left: the defaults live in the request model only."""
    fields = _request_fields(module)
    tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "payload" or isinstance(node, ast.arg) and node.arg == "payload":
            found.append(f"line {node.lineno}: payload")
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        key = node.args[0].value
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2 and key in fields:
            found.append(f"line {node.lineno}: .get({key!r}, default)")
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in fields:
            found.append(f"line {node.lineno}: getattr(..., {node.args[1].value!r}, default)")
    assert found == [], (module, found)


def test_result_models_write_the_keys_clients_read() -> None:
    from core.contract.results.training import NewsMetrics, RankMetrics, TrainBDHResult

    rank = RankMetrics.model_validate({"mrr": 0.5, "mr": 3.0, "hits@1": 0.25, "hits@3": 0.5, "hits@10": 1.0,
                                       "n_queries": 4})
    assert rank.model_dump(mode="json") == {"mrr": 0.5, "mr": 3.0, "hits@1": 0.25, "hits@3": 0.5, "hits@10": 1.0,
                                            "n_queries": 4}
    news = {"auc": 0.6, "mrr": 0.4, "ndcg@5": 0.3, "ndcg@10": 0.35, "pooled_auc": 0.61, "impressions": 9,
            "mean_score_fake": None, "mean_score_real": None}
    assert NewsMetrics.model_validate(news).model_dump(mode="json") == news
    config = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0,
              "softmax_attention": False, "cls_token": False, "img_size": 8, "patch_size": 4, "in_channels": 1,
              "num_classes": 10}
    bdh = {"history": [{"epoch": 1, "train_loss": 1.0}], "steps": [{"step": 1, "epoch": 1.0, "loss": 1.0}],
           "warnings": [], "artifacts": [], "best_epoch": 1, "best_val_accuracy": 0.5, "test_accuracy": 0.4,
           "parameters": 10, "expected_parameters": 10, "epochs_completed": 1, "resumed_from": None,
           "model_name": "bdh-digits-x", "model_config": config, "device": "cpu", "precision": "fp32",
           "optimizer": "AdamW", "samples": {"train": 8, "val": 1, "test": 2},
           "changed_on_resume": {"lr": {"checkpoint": 0.1, "requested": 0.2}}, "provenance": None}
    assert TrainBDHResult.model_validate(bdh).model_dump(mode="json") == bdh
    with pytest.raises(ValueError, match="extra_forbidden"):
        TrainBDHResult.model_validate({**bdh, "surprise": 1})


def test_library_configs_carry_every_shared_request_field() -> None:
    """The TrainConfig / AblationConfig a job builds holds the request's value of every field they share."""
    from core.kinds.ablations import AblationRequest
    from core.kinds.train_bdh import TrainBDHRequest
    from core.kinds.train_news import TrainNewsRequest
    from models.lora.experiment import AblationConfig
    from workers.jobs import ablations, train_bdh, train_news

    bdh = TrainBDHRequest(dataset="cifar10", epochs=3, batch_size=7, grad_accum_steps=2, lr=0.02, weight_decay=0.5,
                          warmup_steps=9, compile="default", precision="bf16", deterministic=True, seed=5,
                          val_fraction=0.3, max_train_samples=11, augment=False, num_workers=2,
                          keep_checkpoints="all", model={"n_layer": 2, "n_embd": 16, "n_head": 2,
                                                         "mlp_multiplier": 2})
    cfg = train_bdh.train_config(bdh, Path("/data/cifar"), "cpu")
    for f in dataclasses.fields(cfg):
        if f.name in TrainBDHRequest.model_fields and f.name not in ("model", "data_dir"):
            assert getattr(cfg, f.name) == getattr(bdh, f.name), f.name
    assert cfg.data_dir == "/data/cifar" and (cfg.model.n_layer, cfg.model.n_embd) == (2, 16)
    assert train_bdh.train_config(TrainBDHRequest(), None, "cuda").num_workers == 4
    assert train_bdh.train_config(TrainBDHRequest(), None, "cpu").num_workers == 0

    news = TrainNewsRequest(name="n", dataset="d", epochs=5, batch_size=3, lr=0.01, npratio=2, max_history=7, seed=4,
                            precision="fp16")
    cfg = train_news.train_config(news)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.negatives, cfg.max_history, cfg.seed, cfg.precision) == \
        (5, 3, 0.01, 2, 7, 4, "fp16")

    abl = AblationRequest(dataset="d", representations=["simple_stats"], layer_sets=["visual"], num_runs=4,
                          n_splits=2, quick=True, sample_layers=0.5, cache_features=False, batch_size=8,
                          max_epochs=3, patience=2, hidden_dim=16, dropout=0.1, weight_decay=0.2, precision="fp32",
                          seed=9)
    cfg = ablations.ablation_config(abl)
    for f in dataclasses.fields(AblationConfig):
        assert getattr(cfg, f.name) == getattr(abl, f.name), f.name
    assert ablations.ablation_config(AblationRequest(dataset="d")).representations == \
        list(importlib.import_module("models.lora.keys").REPRESENTATION_NAMES)
