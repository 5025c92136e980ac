"""New-job forms generated from the request schemas in the service's public OpenAPI document.

Each submit route's JSON schema becomes a list of ``FormField``: numbers keep their limits, enums become
selects, booleans checkboxes, nested models fieldsets, and anything else (lists of triples, unions) a JSON
text field. The posted form is turned back into the JSON body; the API validates it and its 422 ``loc`` is
mapped back onto the field that caused it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import FormData

TOGGLE = ".__on"  # the checkbox that includes an optional nested object


@dataclass
class FormField:
    name: str  # dotted path in the JSON body
    label: str
    widget: str  # number | text | select | checkbox | checkboxes | json | lines | textarea | group
    required: bool = False
    default: Any = None
    description: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    options: list[str] = field(default_factory=list)
    children: list[FormField] = field(default_factory=list)
    optional_group: bool = False
    number_type: str = "number"

    @property
    def dom_id(self) -> str:
        return "f-" + self.name.replace(".", "-")

    def display_default(self) -> str:
        if self.default is None:
            return ""
        if self.widget == "json":
            return self.default if isinstance(self.default, str) else json.dumps(self.default)
        return str(self.default)


def submit_routes(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """kind name -> {route, summary, schema, kind} for every ``POST`` route tagged ``submit``; ``kind`` is the
    kind's own description (``x-explainq-kind``: title, renderer, pickers, widgets...)."""
    out: dict[str, dict[str, Any]] = {}
    for path, ops in openapi.get("paths", {}).items():
        op = ops.get("post")
        if not op or "submit" not in op.get("tags", []):
            continue
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        described = op.get("x-explainq-kind") or {}
        name = described.get("name") or path.strip("/").replace("/", "_").replace("-", "_")
        out[name] = {"route": path, "summary": op.get("summary", ""), "schema": schema, "kind": described,
                     "title": described.get("title") or name}
    return dict(sorted(out.items()))


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        return components.get(ref.rsplit("/", 1)[-1], {})
    return schema


def _nullable(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the non-null alternative, nullable) of an ``anyOf [X, null]``; the schema itself otherwise."""
    alts = schema.get("anyOf")
    if not alts:
        return schema, False
    real = [a for a in alts if a.get("type") != "null"]
    if len(real) == 1:
        return {**real[0], **{k: v for k, v in schema.items() if k not in ("anyOf",)}}, len(real) < len(alts)
    return schema, len(real) < len(alts)


def _label(name: str, schema: dict[str, Any]) -> str:
    return schema.get("title") or name.replace("_", " ").capitalize()


def fields_for(widgets: dict[str, str], schema: dict[str, Any], components: dict[str, Any], prefix: str = "",
               required: frozenset[str] | None = None) -> list[FormField]:
    """The form fields of a request schema; ``widgets`` (the kind's own, dotted field -> widget name) replace the
    widget the schema implies."""
    schema = _resolve(schema, components)
    req = frozenset(schema.get("required", [])) if required is None else required
    out: list[FormField] = []
    for name, raw in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if widgets.get(path) == "news_samples":
            out.append(_sample_composer(raw, components))
        else:
            out.append(_form_field(widgets, name, raw, path, req, components))
    return out


def _form_field(widgets: dict[str, str], name: str, raw: dict[str, Any], path: str, req: frozenset[str],
                components: dict[str, Any]) -> FormField:
    """One property's field: a JSON text field unless its schema implies a better widget."""
    prop, nullable = _nullable(raw)
    prop = {**_resolve(prop, components), **{k: v for k, v in prop.items() if k != "$ref"}}
    f = FormField(name=path, label=_label(name, raw), widget="json", required=name in req,
                  default=raw.get("default"), description=raw.get("description", "")
                  or prop.get("description", ""))
    _set_widget(f, prop, nullable, widgets, components)
    _adjust_for_null(f, raw, nullable)
    return f


def _set_widget(f: FormField, prop: dict[str, Any], nullable: bool, widgets: dict[str, str],
                components: dict[str, Any]) -> None:
    """The widget the property's schema implies: a fieldset, number, checkbox, select, checkboxes or text."""
    if prop.get("properties"):
        f.widget = "group"
        f.children = fields_for(widgets, prop, components, prefix=f.name + ".")
        f.optional_group = nullable
    elif prop.get("type") in ("integer", "number"):
        _set_number(f, prop)
    elif prop.get("type") == "boolean":
        f.widget = "checkbox"
    elif prop.get("enum") and prop.get("type") == "string":
        f.widget, f.options = "select", list(prop["enum"])
    elif prop.get("type") == "array" and (prop.get("items") or {}).get("enum"):
        f.widget, f.options = "checkboxes", list(prop["items"]["enum"])
    elif prop.get("type") == "string":
        _set_text(f, prop)


def _set_number(f: FormField, prop: dict[str, Any]) -> None:
    """A number input keeping the schema's limits (exclusive ones as data attributes)."""
    f.widget, f.number_type = "number", prop["type"]
    for key, attr in (("minimum", "min"), ("maximum", "max")):
        if key in prop:
            f.attrs[attr] = _num(prop[key])
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in prop:
            f.attrs["data-" + key.lower()] = _num(prop[key])
    f.attrs["step"] = "1" if prop["type"] == "integer" else "any"


def _set_text(f: FormField, prop: dict[str, Any]) -> None:
    """A text input keeping the schema's length limits and pattern."""
    f.widget = "text"
    for key, attr in (("maxLength", "maxlength"), ("minLength", "minlength"), ("pattern", "pattern")):
        if key in prop:
            f.attrs[attr] = prop[key]


def _adjust_for_null(f: FormField, raw: dict[str, Any], nullable: bool) -> None:
    """A nullable field is optional (a select gains an empty choice); a JSON field of a union says so."""
    if nullable and f.widget != "group":
        f.required = False
    if nullable and f.widget == "select" and f.default is None:
        f.options = ["", *f.options]  # unset: the server picks (e.g. the rule that suits a tolerance)
    if f.widget == "json" and "anyOf" in raw:
        f.description = (f.description + " " if f.description else "") + "(JSON, or a plain word such as auto)"


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


def _sample_composer(raw: dict[str, Any], components: dict[str, Any]) -> FormField:
    """One inline sample, composed field by field (a dataset can replace it)."""
    sample = components.get("SampleIn", {}).get("properties", {})
    label_enum = next((a.get("enum") for a in sample.get("label", {}).get("anyOf", []) if a.get("enum")), [])
    cand = sample.get("candidate", {})
    return FormField(
        name="sample", label="Sample", widget="group",
        description="one user and one candidate headline; leave the headline empty to use a dataset instead",
        children=[
            FormField("sample.id", "Id", "text", default="s1", attrs={"maxlength": 200}),
            FormField("sample.candidate", "Candidate headline", "text",
                      attrs={"maxlength": cand.get("maxLength", 2000)}),
            FormField("sample.history", "History", "lines",
                      description="titles the user clicked, one per line"),
            FormField("sample.label", "Label", "select", options=[""] + list(label_enum)),
            FormField("sample.candidate_body", "Candidate body", "textarea",
                      description="for models with a body view (NAML)"),
        ],
    )


def apply_pickers(pickers: dict[str, Any], fields: list[FormField], models: dict[str, Any]) -> None:
    """Turn registry-name fields into selects of the registered models or datasets of the right kind
    (``pickers``: the kind's own, dotted field -> [section, registry kind])."""
    for f in fields:
        if f.children:
            apply_pickers(pickers, f.children, models)
            continue
        picker = pickers.get(f.name)
        if not picker:
            continue
        section, reg_kind = picker
        names = [m["name"] for m in models.get(section, []) if m.get("kind") == reg_kind]
        if f.default is not None and str(f.default) not in names:
            names.insert(0, str(f.default))
        if names:
            f.widget = "select"
            f.options = ([""] if not f.required else []) + names


_OMIT = object()  # a field left out of the body


def body_from_form(fields: list[FormField], form: FormData) -> dict[str, Any]:
    """The JSON body for the API from the posted form (empty optional fields are left out)."""
    body: dict[str, Any] = {}
    for f in fields:
        if f.name == "sample":
            sample = _sample_from_form(form)
            if sample is not None:
                body["samples"] = [sample]
            continue
        key = f.name.rsplit(".", 1)[-1]
        value = _field_value(f, form)
        if value is not _OMIT:
            body[key] = value
    return body


def _field_value(f: FormField, form: FormData) -> Any:
    """One field's value from the posted form, or ``_OMIT`` (an optional group switched off, an empty input)."""
    if f.widget == "group":
        if f.optional_group and not form.get(f.name + TOGGLE):
            return _OMIT
        return body_from_form(f.children, form)
    if f.widget == "checkbox":
        return form.get(f.name) is not None
    if f.widget == "checkboxes":
        return [str(v) for v in form.getlist(f.name)]
    raw = str(form.get(f.name) or "").strip()
    if raw == "":
        return _OMIT
    return _typed(f, raw)


def _typed(f: FormField, raw: str) -> Any:
    """A non-empty text input's value as its widget reads it (a number, JSON, lines, or the text itself)."""
    if f.widget == "number":
        return _number(raw, f.number_type)
    if f.widget == "json":
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    if f.widget == "lines":
        return [line.strip() for line in raw.splitlines() if line.strip()]
    return raw


def _number(raw: str, number_type: str) -> int | float | str:
    try:
        return int(raw) if number_type == "integer" else float(raw)
    except ValueError:
        return raw  # the API names the field in its 422


def _sample_from_form(form: FormData) -> dict[str, Any] | None:
    candidate = str(form.get("sample.candidate") or "").strip()
    if not candidate:
        return None
    out: dict[str, Any] = {
        "id": str(form.get("sample.id") or "").strip() or "s1",
        "candidate": candidate,
        "history": [t.strip() for t in str(form.get("sample.history") or "").splitlines() if t.strip()],
    }
    if form.get("sample.label"):
        out["label"] = str(form.get("sample.label"))
    body = str(form.get("sample.candidate_body") or "").strip()
    if body:
        out["candidate_body"] = body
    return out


def field_names(fields: list[FormField]) -> set[str]:
    out: set[str] = set()
    for f in fields:
        out.add(f.name)
        out |= field_names(f.children)
    return out


def errors_by_field(detail: Any, fields: list[FormField]) -> tuple[dict[str, str], list[str]]:
    """Map a 422's ``detail[].loc`` onto form field names; errors no field owns come back as a list."""
    names = field_names(fields)
    by_field: dict[str, str] = {}
    general: list[str] = []
    for d in detail if isinstance(detail, list) else []:
        loc = [p for p in d.get("loc", []) if p != "body"]
        msg = str(d.get("msg", "invalid"))
        if loc and loc[0] == "samples":
            loc = ["sample"] + [p for p in loc[2:] if isinstance(p, str)]
        parts = [str(p) for p in loc if isinstance(p, str)]
        target = None
        for n in range(len(parts), 0, -1):
            cand = ".".join(parts[:n])
            if cand in names:
                target = cand
                break
        where = ".".join(str(p) for p in loc)
        if target is None:
            general.append(f"{where or 'request'}: {msg}")
        else:
            extra = "" if where == target else f" ({where})"
            by_field[target] = (by_field[target] + "; " if target in by_field else "") + msg + extra
    return by_field, general
