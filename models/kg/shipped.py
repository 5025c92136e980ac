"""The knowledge graphs shipped with explainq: Nations, UMLS and Kinships, with their standard splits.

Each lives in ``models/kg/data/<name>/`` as ``train.txt`` / ``valid.txt`` / ``test.txt`` (``head<TAB>relation<TAB>
tail``), copied byte for byte from the PyKEEN 1.11.1 wheel (MIT licence; see each directory's ``SOURCE.md``), so
nothing is downloaded at run time and PyKEEN is not needed to read them. :func:`verify_shipped` checks every file
against its recorded SHA-256, and :func:`models.kg.triples.load_shipped` calls it before parsing: a damaged copy is
refused naming the file, never read as a smaller or different graph. (This module knows the files, not how to
parse them: it imports nothing of :mod:`models.kg.triples`.)

Each graph's ``published`` holds the filtered link-prediction figures Dettmers et al. (2018) report for ConvE on it
(``CONVE_SOURCE``), as the authors' repository lists them (github.com/TimDettmers/ConvE, README, "Predictive
performance").
They are context for this project's own measurements, never a measurement of it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from models.kg.tsv import TriplesFormatError

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLIT_FILES = ("train.txt", "valid.txt", "test.txt")


class ShippedDataError(TriplesFormatError):
    """A shipped dataset file that is missing or not the recorded one (the message names the file)."""


@dataclass(frozen=True)
class ShippedGraph:
    """One shipped graph: its published split sizes and vocabulary, and the SHA-256 of each split file."""

    name: str
    title: str
    entities: int
    relations: int
    splits: dict[str, int]
    sha256: dict[str, str]
    citation: str
    published: dict[str, float] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return DATA_DIR / self.name


CONVE_SOURCE = ("Dettmers et al. 2018, Convolutional 2D Knowledge Graph Embeddings (AAAI), ConvE, filtered; "
                "figures from github.com/TimDettmers/ConvE README")

SHIPPED: dict[str, ShippedGraph] = {g.name: g for g in (
    ShippedGraph(
        name="nations", title="Nations", entities=14, relations=55,
        splits={"train": 1592, "valid": 199, "test": 201},
        sha256={"train.txt": "0830fa9da8e5bba2ccdaa45b7bdc9130451ba66b09ff2708f35fccaf82473e57",
                "valid.txt": "2b337a62e51a2f45c283eac98a70d21b7e0e102136be1539b2a52c652a7b0530",
                "test.txt": "3971085165b47b6aeaec68058c6d8d98b3005e929db81268410b95ae4db770ab"},
        citation="R. J. Rummel's Dimensionality of Nations project, as used by Kok & Domingos 2007; PyKEEN cites "
                 "the split to Zhenfeng Lei 2017, github.com/ZhenfengLei/KGDatasets",
        published={"mr": 2, "mrr": 0.82, "hits@1": 0.72, "hits@3": 0.88, "hits@10": 1.00}),
    ShippedGraph(
        name="umls", title="UMLS (Unified Medical Language System semantic network)", entities=135, relations=46,
        splits={"train": 5216, "valid": 652, "test": 661},
        sha256={"train.txt": "873ef4925516b83e7f6f8cc02b4be51d848828710a7f65a956f0ac4a9e452f35",
                "valid.txt": "025c98f8a4891e2a6582ec5b40ee0d904031edad9c52554522f4b7904820c98e",
                "test.txt": "a7eb529a3d2810fcc96341ccc97c625a5e202f8389673aa6bd317eeebbb79014"},
        citation="the UMLS semantic network (McCray 2003), as used by Kok & Domingos 2007; PyKEEN cites the split "
                 "to Zhenfeng Lei 2017, github.com/ZhenfengLei/KGDatasets",
        published={"mr": 1, "mrr": 0.94, "hits@1": 0.92, "hits@3": 0.97, "hits@10": 0.99}),
    ShippedGraph(
        name="kinships", title="Kinships (Alyawarra kinship terms)", entities=104, relations=25,
        splits={"train": 8544, "valid": 1068, "test": 1074},
        sha256={"train.txt": "738612111a6acf0e39662bde24c7e72a4d1edf20931beea077da367dda689731",
                "valid.txt": "c56f8630a583178b1e569f11a64aa535ae1ce0b0912d8b1e24716be2b37f04da",
                "test.txt": "05e5733265761d55be9c05bfaff5a8d0808df46f9c1e9d66cc3f2fe114e43d88"},
        citation="Alyawarra kinship terms (Denham 1973), as used by Kemp et al. 2006 (PyKEEN's citation) and Kok & "
                 "Domingos 2007",
        published={"mr": 2, "mrr": 0.83, "hits@1": 0.73, "hits@3": 0.91, "hits@10": 0.98}),
)}


def shipped_graph(name: str) -> ShippedGraph:
    try:
        return SHIPPED[name]
    except KeyError:
        raise KeyError(f"no shipped dataset {name!r}; shipped: {', '.join(SHIPPED)}") from None


def shipped_dir(name: str) -> Path:
    """Directory of a shipped dataset (``nations``, ``umls``, ``kinships``)."""
    return shipped_graph(name).directory


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_shipped(name: str, directory: Path | None = None) -> Path:
    """Check every split file of the shipped dataset ``name`` (in ``directory``, by default its own) against its
    recorded SHA-256; returns the directory. ShippedDataError names the first missing or differing file."""
    graph = shipped_graph(name)
    directory = Path(directory) if directory is not None else graph.directory
    for fname in SPLIT_FILES:
        path = directory / fname
        shown = f"{name}/{fname}"
        if not path.is_file():
            raise ShippedDataError(f"shipped dataset file {shown} is missing; reinstall explainq")
        got = sha256_file(path)
        if got != graph.sha256[fname]:
            raise ShippedDataError(f"shipped dataset file {shown} is damaged: its SHA-256 is {got[:12]}..., the "
                                   f"recorded one (models/kg/data/{name}/SOURCE.md) {graph.sha256[fname][:12]}...; "
                                   "reinstall explainq")
    return directory
