"""The README's bring-your-own request files are valid requests of their routes' schemas, and the new kinds are
registered on the routes the README names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.routers.imports import DatasetRequest
from core.contract.kind import load_kinds as load_all

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "byo"
ROUTES = {"register-dataset": None, "train-news": "train_news", "train-news-roberta": "train_news",
          "train-naml-glove": "train_news", "explain-news": "attributions", "import-conve": "import_model",
          "import-nrms": "import_model", "import-vision-bdh": "import_model", "tracin-batch": "tracin"}


def test_every_example_is_covered() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.json")} == set(ROUTES)


@pytest.mark.parametrize("stem", sorted(ROUTES))
def test_example_matches_its_schema(stem: str) -> None:
    body = json.loads((EXAMPLES / f"{stem}.json").read_text())
    kind = ROUTES[stem]
    schema = DatasetRequest if kind is None else load_all()[kind].request
    schema.model_validate(body)


def test_routes() -> None:
    kinds = load_all()
    assert kinds["train_news"].route == "/train/news" and kinds["train_news"].queue == "train"
    assert kinds["import_model"].route == "/models/import"


def test_detects_triples_and_cifar_and_registered_cifar_name_reaches_train_bdh(tmp_path, redis_settings) -> None:
    from core import registry
    from core.contract.errors import FieldError
    from core.dataset_formats import FormatError, detect
    from core.kinds.train_bdh import TrainBDHRequest
    from core.kinds.train_bdh import validate as validate_bdh

    trip = tmp_path / "kg"
    trip.mkdir()
    (trip / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    (trip / "test.txt").write_text("a\tr\tc\n")
    assert detect(trip) == {"format": "triples", "kind": "triples",
                            "counts": {"train_triples": 2, "test_triples": 1, "entities": 3, "relations": 1}}
    (trip / "valid.txt").write_text("a\tr\n")
    with pytest.raises(FormatError, match="valid.txt:1"):
        detect(trip)
    cifar = redis_settings.data_roots[0] / "cifar"
    cifar.mkdir(parents=True)
    for f in ("data_batch_1", "test_batch", "batches.meta"):
        (cifar / f).write_bytes(b"x")
    found = detect(cifar)
    assert found["format"] == "cifar10" and found["kind"] == "image_classification"
    registry.register_dataset(redis_settings, "my-cifar", kind=found["kind"], path=cifar, owner="alice")
    req = TrainBDHRequest(dataset="cifar10", data_dir="my-cifar")
    validate_bdh(req, redis_settings, "alice")
    # the name stays as given (the stored request shows no server path); the worker resolves it by the same rule
    from core.kinds.train_bdh import cifar_dir

    assert req.data_dir == "my-cifar"
    assert cifar_dir(redis_settings, "cifar10", "my-cifar", "alice") == cifar.resolve()
    with pytest.raises(FieldError):
        validate_bdh(TrainBDHRequest(dataset="cifar10", data_dir="not-there"), redis_settings, "alice")
