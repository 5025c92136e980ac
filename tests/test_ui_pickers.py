"""A form's model picker takes every registry kind its kind accepts: the attributions form offers news models and
Hugging Face classifiers, and the models page opens it for either."""

from __future__ import annotations

from app.ui import forms
from app.ui.router import explain_actions
from core.contract.kind import load_kinds

MODELS = {"models": [{"name": "nrms-demo", "kind": "news"}, {"name": "bert-sst", "kind": "hf_classifier"},
                     {"name": "digits-cnn", "kind": "exported_classifier"},
                     {"name": "conve-demo", "kind": "conve"}]}


def _described() -> list[dict]:
    return [k.describe() for k in load_kinds().values() if not k.internal]


def test_the_attributions_picker_names_every_registry_kind_it_explains() -> None:
    attributions = next(k for k in _described() if k["name"] == "attributions")
    assert attributions["pickers"]["model"] == ["models", ["news", "hf_classifier", "exported_classifier"]]
    assert attributions["pickers"]["dataset.name"] == ["datasets", "news"]  # one kind: as before


def test_the_form_offers_every_model_its_kind_takes() -> None:
    attributions = next(k for k in _described() if k["name"] == "attributions")
    model = forms.FormField(name="model", label="Model", widget="text", required=True)
    forms.apply_pickers(attributions["pickers"], [model], MODELS)
    assert model.widget == "select" and model.options == ["nrms-demo", "bert-sst", "digits-cnn"]


def test_the_models_page_opens_the_attributions_form_for_a_classifier() -> None:
    kinds = _described()
    # a classifier can be explained, trained further from its weights, traced to its training data, and its
    # training data's gradients stored for repeated queries
    for kind in ("hf_classifier", "exported_classifier"):
        assert [a["kind"] for a in explain_actions(kinds, kind)] == ["attributions", "train_classifier",
                                                                   "classifier_influence",
                                                                   "classifier_featurize"]
    assert "attributions" in [a["kind"] for a in explain_actions(kinds, "news")]
    assert "tracin" in [a["kind"] for a in explain_actions(kinds, "conve")]
