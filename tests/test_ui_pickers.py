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
    # training data's gradients stored for repeated queries, and its estimators evaluated
    for kind in ("hf_classifier", "exported_classifier"):
        assert [a["kind"] for a in explain_actions(kinds, kind)] == ["attributions", "train_classifier",
                                                                   "classifier_influence",
                                                                   "classifier_featurize",
                                                                   "evaluate_classifier_attribution",
                                                                   "evaluate_classifier_mislabel"]
    assert "attributions" in [a["kind"] for a in explain_actions(kinds, "news")]
    assert "tracin" in [a["kind"] for a in explain_actions(kinds, "conve")]


def _model_field() -> forms.FormField:
    return forms.FormField(name="model", label="Model", widget="text", required=True, description="The model")


def test_a_form_says_which_model_is_still_being_prepared_and_when() -> None:
    attributions = next(k for k in _described() if k["name"] == "attributions")
    coming = {"models": [{"name": "nrms-word-demo", "status": "preparing", "kind": None,
                          "preparation": {"step": "news", "state": "pending", "kinds": ["attributions"],
                                          "retry_after_s": 400}},
                         {"name": "conve-nations-demo", "status": "preparing", "kind": None,
                          "preparation": {"step": "kg", "state": "preparing", "kinds": ["tracin"],
                                          "retry_after_s": 30}}]}
    model = _model_field()
    forms.apply_pickers(attributions["pickers"], [model], coming, "attributions")
    assert model.widget == "text" and model.description.startswith("The model Still being prepared: ")
    assert "nrms-word-demo (ready in about 6 min 40 s)" in model.description
    assert "conve-nations-demo" not in model.description  # prepared for another kind


def test_a_form_with_no_model_to_offer_says_one_must_be_imported_or_trained() -> None:
    attributions = next(k for k in _described() if k["name"] == "attributions")
    model = _model_field()
    forms.apply_pickers(attributions["pickers"], [model], {"models": [{"name": "conve-demo", "kind": "conve"}]},
                        "attributions")
    assert "No model of a kind this job takes (news, hf_classifier, exported_classifier) is registered yet" \
        in model.description
    offered = _model_field()
    forms.apply_pickers(attributions["pickers"], [offered], MODELS, "attributions")
    assert offered.description == "The model" and offered.widget == "select"
