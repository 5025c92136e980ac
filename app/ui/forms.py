"""New-job forms generated from the request schemas in the service's public OpenAPI document.

Each submit route's JSON schema becomes a list of ``FormField``: numbers keep their limits, enums become
selects, booleans checkboxes, nested models fieldsets, and anything else (unions) a JSON text field. Labels and
help are the schema's ``title`` and ``description``; fields marked ``advanced`` (``json_schema_extra``) go under
an "Advanced" fold after the essentials, the job's label and tags. A kind's own widgets replace what the schema
implies: ``news_samples`` (rows of samples) and ``triples`` (rows of head, relation, tail). The posted form is
turned back into the JSON body; the API validates it and its 422 ``loc`` is mapped back onto the field that
caused it.
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
    advanced: bool = False  # folded under "Advanced" (the schema's ``advanced``)

    @property
    def dom_id(self) -> str:
        return "f-" + self.name.replace(".", "-")

    def display_default(self) -> str:
        if self.default is None:
            return ""
        if self.widget == "json":
            return self.default if isinstance(self.default, str) else json.dumps(self.default)
        if self.widget == "tags":
            return ", ".join(self.default) if isinstance(self.default, list) else str(self.default)
        return str(self.default)

    @property
    def rows_widget(self) -> bool:
        return self.widget in ("samples", "triples")


def submit_routes(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """kind name -> {route, summary, schema, kind} for every ``POST`` route tagged ``submit`` that describes its
    kind; ``kind`` is the kind's own description (``x-explainq-kind``: name, title, renderer, pickers, widgets...),
    and the kind's name is the job's ``kind`` (``import_model``, never one made from its route)."""
    out: dict[str, dict[str, Any]] = {}
    for path, ops in openapi.get("paths", {}).items():
        op = ops.get("post")
        if not op or "submit" not in op.get("tags", []):
            continue
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        described = op.get("x-explainq-kind") or {}
        name = described.get("name")
        if not name:  # every kind's route describes itself; its name is the one users see everywhere
            continue
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


# The fields every kind's request has (core.kinds.base.JobRequest): after the kind's essentials.
JOB_FIELDS = ("label", "tags")


def fields_for(widgets: dict[str, str], schema: dict[str, Any], components: dict[str, Any], prefix: str = "",
               required: frozenset[str] | None = None) -> list[FormField]:
    """The form fields of a request schema, essentials first, then the job's label and tags, then the fields
    marked ``advanced``; ``widgets`` (the kind's own, dotted field -> widget name) replace the widget the schema
    implies."""
    schema = _resolve(schema, components)
    req = frozenset(schema.get("required", [])) if required is None else required
    out: list[FormField] = []
    for name, raw in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        widget = widgets.get(path)
        if widget == "news_samples":
            f = _sample_composer(raw, components)
        elif widget == "triples":
            f = FormField(name=path, label=_label(name, raw), widget="triples", required=name in req,
                          description=raw.get("description", ""))
        else:
            f = _form_field(widgets, name, raw, path, req, components)
        f.advanced = bool(raw.get("advanced"))
        if not prefix and name == "tags":
            f.widget = "tags"
            f.attrs = {"maxlength": 600}
        out.append(f)
    if prefix:
        return out
    rank = {name: i for i, name in enumerate(JOB_FIELDS)}
    return sorted(out, key=lambda f: (f.advanced, f.name in rank, rank.get(f.name, 0)))


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


# A sample row's fields: (key, widget); their labels and help come from the schema's SampleIn.
SAMPLE_FIELDS = (("id", "text"), ("candidate", "text"), ("history", "lines"), ("label", "select"),
                 ("candidate_body", "textarea"))
TRIPLE_PARTS = ("head", "relation", "tail")


def _sample_composer(raw: dict[str, Any], components: dict[str, Any]) -> FormField:
    """Rows of samples (add and remove rows; a dataset can replace them), each composed field by field."""
    sample = components.get("SampleIn", {}).get("properties", {})
    children = []
    for key, widget in SAMPLE_FIELDS:
        prop = sample.get(key, {})
        child = FormField(f"sample.{key}", _label(key, prop), widget, description=prop.get("description", ""))
        if key == "label":
            enum = next((a.get("enum") for a in prop.get("anyOf", []) if a.get("enum")), [])
            child.options = ["", *enum]
        elif key in ("id", "candidate"):
            child.attrs = {"maxlength": _max_length(prop, 200 if key == "id" else 2000)}
        children.append(child)
    return FormField(name="sample", label=_label("samples", raw), widget="samples",
                     description=raw.get("description", ""), children=children)


def _max_length(prop: dict[str, Any], default: int) -> int:
    return int(prop.get("maxLength") or next((a.get("maxLength") for a in prop.get("anyOf", [])
                                              if a.get("maxLength")), default))


def registry_kinds(picker: list[Any]) -> list[str]:
    """The registry kinds a picker ``[section, kind or kinds]`` offers."""
    return list(picker[1]) if isinstance(picker[1], list | tuple) else [picker[1]]


def apply_pickers(pickers: dict[str, Any], fields: list[FormField], models: dict[str, Any],
                  job_kind: str | None = None) -> None:
    """Turn registry-name fields into selects of the registered models or datasets of the right kind
    (``pickers``: the kind's own, dotted field -> [section, registry kind or a list of them]). A field's hint says
    which of them the first start is still preparing for ``job_kind`` (``GET /models``' ``preparing`` entries, with
    the estimate of when each is ready), and, when none is registered or coming, that one must be imported or
    trained first: never an empty list without a word why."""
    from app.ui.views import duration

    for f in fields:
        if f.children:
            apply_pickers(pickers, f.children, models, job_kind)
            continue
        picker = pickers.get(f.name)
        if not picker:
            continue
        section, reg_kinds = picker[0], registry_kinds(picker)
        listed = models.get(section, [])
        names = [m["name"] for m in listed if m.get("kind") in reg_kinds and m.get("status", "ready") != "preparing"]
        coming = [m for m in listed if m.get("status") == "preparing"
                  and (job_kind is None or job_kind in ((m.get("preparation") or {}).get("kinds") or []))]
        notes = []
        if coming:
            notes.append("Still being prepared: " + ", ".join(
                f"{m['name']} (ready in about {duration((m.get('preparation') or {}).get('retry_after_s'))})"
                for m in coming) + "; the list offers it once it is registered (reload then).")
        elif not names:
            what = "model" if section == "models" else "dataset"
            notes.append(f"No {what} of a kind this job takes ({', '.join(reg_kinds)}) is registered yet: "
                         f"{'import or train one' if section == 'models' else 'register one'} first "
                         "(the Models page).")
        if notes:
            f.description = " ".join([f.description, *notes]).strip()
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
        if f.widget == "samples":
            samples = samples_from_form(form)
            if samples:
                body["samples"] = samples
            continue
        if f.widget == "triples":
            triples = triples_from_form(form, f.name)
            if triples:
                body[f.name.rsplit(".", 1)[-1]] = triples
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
    if f.widget == "tags":
        return [t for t in raw.replace(",", " ").split() if t]
    return raw


def _number(raw: str, number_type: str) -> int | float | str:
    try:
        return int(raw) if number_type == "integer" else float(raw)
    except ValueError:
        return raw  # the API names the field in its 422


def _column(form: FormData, name: str, n: int) -> list[str]:
    values = [str(v) for v in form.getlist(name)]
    return (values + [""] * n)[:n]


def samples_from_form(form: FormData) -> list[dict[str, Any]]:
    """The sample rows of a posted form (every row posts each of its fields, so they line up); a row with
    neither a headline nor a history is left out."""
    n = len(form.getlist("sample.candidate"))
    cols = {key: _column(form, f"sample.{key}", n) for key, _ in SAMPLE_FIELDS}
    out = []
    for i in range(n):
        candidate = cols["candidate"][i].strip()
        history = [t.strip() for t in cols["history"][i].splitlines() if t.strip()]
        if not candidate and not history:
            continue
        sample: dict[str, Any] = {"id": cols["id"][i].strip() or f"s{len(out) + 1}", "candidate": candidate,
                                  "history": history}
        if cols["label"][i]:
            sample["label"] = cols["label"][i]
        if cols["candidate_body"][i].strip():
            sample["candidate_body"] = cols["candidate_body"][i].strip()
        out.append(sample)
    return out


def triples_from_form(form: FormData, name: str) -> list[list[str]]:
    """The triple rows of a posted form (head, relation, tail); an empty row is left out."""
    n = len(form.getlist(f"{name}.head"))
    cols = [_column(form, f"{name}.{part}", n) for part in TRIPLE_PARTS]
    rows = [[c[i].strip() for c in cols] for i in range(n)]
    return [r for r in rows if any(r)]


def rows_of(fields: list[FormField], body: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The rows a request body holds for the form's row widgets (a clone's samples and triples)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for f in fields:
        if f.widget == "samples" and isinstance(body.get("samples"), list):
            rows[f.name] = [{"id": s.get("id", ""), "candidate": s.get("candidate", ""),
                             "history": "\n".join(s.get("history") or []), "label": s.get("label") or "",
                             "candidate_body": s.get("candidate_body") or ""}
                            for s in body["samples"] if isinstance(s, dict)]
        elif f.widget == "triples" and isinstance(body.get(f.name), list):
            rows[f.name] = [dict(zip(TRIPLE_PARTS, t, strict=False)) for t in body[f.name] if isinstance(t, list)]
    return rows


def posted_rows(fields: list[FormField], form: FormData) -> dict[str, list[dict[str, Any]]]:
    """The rows as posted, every row kept (a form sent back with its errors shows what was typed)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for f in fields:
        if f.widget == "samples":
            n = len(form.getlist("sample.candidate"))
            cols = {key: _column(form, f"sample.{key}", n) for key, _ in SAMPLE_FIELDS}
            rows[f.name] = [{key: cols[key][i] for key in cols} for i in range(n)]
        elif f.widget == "triples":
            n = len(form.getlist(f"{f.name}.head"))
            cols = {part: _column(form, f"{f.name}.{part}", n) for part in TRIPLE_PARTS}
            rows[f.name] = [{part: cols[part][i] for part in TRIPLE_PARTS} for i in range(n)]
    return rows


def values_of(body: dict[str, Any], fields: list[FormField], prefix: str = "") -> dict[str, Any]:
    """A request body as the form's dotted field values (rows and unset values left out): a list of choices
    stays a list (its checkboxes), tags are joined, anything else that is not text is JSON."""
    choices = {f.name for f in _walk(fields) if f.widget == "checkboxes"}
    out: dict[str, Any] = {}
    for k, v in (body or {}).items():
        name = prefix + k
        if isinstance(v, dict):
            out.update(values_of(v, fields, f"{name}."))
            out[name + TOGGLE] = "on"
        elif isinstance(v, bool):
            out[name] = "true" if v else ""
        elif name == "tags" and isinstance(v, list):
            out[name] = ", ".join(map(str, v))
        elif name in choices and isinstance(v, list):
            out[name] = [str(c) for c in v]
        elif v is not None:
            out[name] = v if isinstance(v, str) else json.dumps(v)
    return out


def _walk(fields: list[FormField]) -> list[FormField]:
    out: list[FormField] = []
    for f in fields:
        out.append(f)
        out += _walk(f.children)
    return out


def field_names(fields: list[FormField]) -> set[str]:
    out: set[str] = set()
    for f in fields:
        out.add(f.name)
        out |= field_names(f.children)
    return out


def _row_fields(fields: list[FormField]) -> set[str]:
    return {f.name for f in fields if f.widget == "triples"}


def errors_by_field(detail: Any, fields: list[FormField]) -> tuple[dict[str, str], list[str]]:
    """Map a 422's ``detail[].loc`` onto form field names; errors no field owns come back as a list."""
    names = field_names(fields)
    by_field: dict[str, str] = {}
    general: list[str] = []
    for d in detail if isinstance(detail, list) else []:
        loc = [p for p in d.get("loc", []) if p != "body"]
        msg = str(d.get("msg", "invalid"))
        if loc and loc[0] == "samples":
            if len(loc) > 1 and isinstance(loc[1], int):
                msg = f"sample {loc[1] + 1}: {msg}"
            loc = ["sample"] + [p for p in loc[2:] if isinstance(p, str)]
        elif len(loc) > 1 and isinstance(loc[1], int) and f"{loc[0]}" in _row_fields(fields):
            part = f", {TRIPLE_PARTS[loc[2]]}" if len(loc) > 2 and isinstance(loc[2], int) and loc[2] < 3 else ""
            msg = f"triple {loc[1] + 1}{part}: {msg}"
            loc = [loc[0]]
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
