"""The README's bring-your-own request files are valid requests of their routes' schemas, and the new kinds are
registered on the routes the README names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.kinds import load_all
from app.routers.imports import DatasetRequest

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
