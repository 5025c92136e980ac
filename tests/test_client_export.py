"""Exports from the SDK: ``to_pandas()`` and ``to_parquet()`` on the result of every kind (a plain result is one row
of its scalars), and ``job.table(name)`` / ``job.export(name, dest)``: any CSV, TSV or JSONL artifact in full, as a
DataFrame, Parquet, CSV or JSONL. The artifact is the service's own writer's output (models/tables.py)."""

from __future__ import annotations

import io
import json

import httpx
import pandas as pd
import pytest
from explainq_client import Client
from explainq_client.results import make_result
from explainq_client.tables import export_frame, table_frame

from models.tables import TableWriter
from tests.result_examples import as_run, example
from tests.test_client_render_analysis import _kinds_with_results


@pytest.mark.parametrize("kind", _kinds_with_results(), ids=lambda k: k.name)
def test_every_kinds_result_has_a_table_and_writes_parquet(kind, tmp_path):
    data = as_run(example(kind.result), kind.result, False)
    result = make_result(kind.renderer, data, kind.name, kind.result.__name__)
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    path = result.to_parquet(tmp_path / "r.parquet")
    back = pd.read_parquet(path)
    assert list(back.columns) == [str(c) for c in frame.columns] and len(back) == len(frame)


def test_a_plain_result_is_one_row_of_its_scalars():
    result = make_result(None, {"rows": 5, "features": {"bytes": 10, "key": "k"}, "names": ["a"]}, "featurize", None)
    frame = result.to_pandas()
    assert frame.to_dict("records") == [{"rows": 5, "features_bytes": 10, "features_key": "k"}]


ROWS = [{"rank": 1, "entity": "=HYPERLINK(\"http://x\",\"y\")", "score": -0.5, "note": None},
        {"rank": 2, "entity": "usa", "score": 0.25, "note": "a, \"quoted\" cell"}]
ENTRIES = [{"test_triple": ["a", "r", "b"], "proponents": [{"influence": 0.5}], "self_influence": 1.0},
           {"test_triple": ["c", "r", "d"], "proponents": [], "self_influence": 2.0}]


def _csv(delimiter=","):
    fh = io.StringIO(newline="")
    TableWriter(fh, ["rank", "entity", "score", "note"], delimiter=delimiter).rows(ROWS)
    return fh.getvalue().encode()


def test_a_csv_or_tsv_export_reads_back_typed_with_its_formula_guard():
    for name, data in (("influence.csv", _csv()), ("corrupted.tsv", _csv("\t"))):
        frame = table_frame(name, data)
        assert list(frame["rank"]) == [1, 2] and list(frame.score) == [-0.5, 0.25]
        assert frame.entity[0] == "'" + ROWS[0]["entity"] and frame.entity[1] == "usa"
        assert pd.isna(frame.note[0]) and frame.note[1] == ROWS[1]["note"]
    assert table_frame("empty.csv", b"").empty
    with pytest.raises(ValueError, match="not a table"):
        table_frame("model.pt", b"x")


def test_every_export_format_round_trips(tmp_path):
    frame = table_frame("results.jsonl", "\n".join(json.dumps(e) for e in ENTRIES).encode() + b"\n\n")
    assert len(frame) == 2 and list(frame.self_influence) == [1.0, 2.0]
    back = pd.read_parquet(export_frame(frame, tmp_path / "x.parquet"))
    assert [list(t) for t in back.test_triple] == [["a", "r", "b"], ["c", "r", "d"]]
    assert list(pd.read_csv(export_frame(frame, tmp_path / "x.csv")).self_influence) == [1.0, 2.0]
    lines = export_frame(frame, tmp_path / "out", "jsonl").read_text().splitlines()
    assert [json.loads(x)["test_triple"] for x in lines] == [e["test_triple"] for e in ENTRIES]
    with pytest.raises(ValueError, match="format 'xlsx'"):
        export_frame(frame, tmp_path / "x.xlsx")
    assert not list(tmp_path.glob("*.part"))


def test_job_table_and_export_read_the_whole_artifact(tmp_path):
    view = {"id": "j1", "kind": "tracin", "status": "succeeded"}
    served = {"/jobs/j1/artifacts/influence.csv": _csv(),
              "/jobs/j1/artifacts/self_influence.jsonl": "\n".join(json.dumps(e) for e in ENTRIES).encode()}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in served:
            return httpx.Response(200, content=served[request.url.path])
        if request.url.path.startswith("/jobs/j1/artifacts/"):
            return httpx.Response(404, json={"detail": {"code": "not_found", "message": "no such artifact"}})
        return httpx.Response(200, json=view)

    with Client("http://x", transport=httpx.MockTransport(handler)) as client:
        job = client.jobs.get("j1")
        assert list(job.table("influence.csv")["rank"]) == [1, 2]
        path = job.export("self_influence.jsonl", tmp_path / "ranking.parquet")
        assert list(pd.read_parquet(path).self_influence) == [1.0, 2.0]


def test_the_cli_exports_an_artifact(tmp_path, monkeypatch, capsys):
    from explainq_client import cli

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/jobs/j1/artifacts/suspects.csv":
            return httpx.Response(200, content=_csv())
        return httpx.Response(200, json={"id": "j1", "kind": "evaluate_mislabel", "status": "succeeded"})

    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=httpx.MockTransport(handler)))
    dest = tmp_path / "suspects.out"
    assert cli.run(["export", "j1", "suspects.csv", str(dest), "--format", "parquet"]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == str(dest)
    assert list(pd.read_parquet(dest).score) == [-0.5, 0.25]
