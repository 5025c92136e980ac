"""Knowledge-graph triples: reading, vocabularies and the shipped datasets (Nations, UMLS, Kinships).

A dataset is a directory with tab-separated ``head<TAB>relation<TAB>tail`` files:

- ``train.txt`` (required), ``valid.txt`` and ``test.txt`` (optional);
- optional id dictionaries ``entities.dict`` and ``relations.dict`` (``name<TAB>id``; the ``id<TAB>name`` order of
  some public dumps is recognised too) that fix the integer ids;
- optional display labels ``entity_labels.tsv`` and ``relation_labels.tsv`` (``name<TAB>label``).

Without dictionaries, ids are assigned in sorted name order over all splits, so they do not depend on file order.
The shipped graphs (``models/kg/data/<name>``, see :mod:`models.kg.shipped`) are read by :func:`load_shipped`, which
checks their files' SHA-256 first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.files import LOCAL, FileAccess, open_text
from models.kg.shipped import verify_shipped
from models.kg.tsv import TriplesFormatError, iter_tsv, read_triples  # noqa: F401  (re-exported)

SPLITS = ("train", "valid", "test")
NATIONS_DIR = Path(__file__).resolve().parent / "data" / "nations"


def nations_dir() -> Path:
    """Directory of the shipped Nations dataset (see its ``SOURCE.md``)."""
    return NATIONS_DIR


def load_shipped(name: str, directory: Path | None = None) -> TriplesDataset:
    """A shipped dataset (``nations``, ``umls``, ``kinships``), its files (in ``directory``, by default its own)
    checked against their SHA-256 first (:func:`models.kg.shipped.verify_shipped`)."""
    return load_triples_dir(verify_shipped(name, directory), name)


def read_id_dict(path: Path, files: FileAccess = LOCAL) -> dict[str, int]:
    """Read an id dictionary, ``name<TAB>id`` (or ``id<TAB>name``, detected per file)."""
    rows: list[tuple[str, str]] = []
    shown = files.display(Path(path))
    for lineno, parts in iter_tsv(path, files):
        if len(parts) != 2:
            raise TriplesFormatError(f"{shown}:{lineno}: expected name<TAB>id, got {len(parts)} fields")
        rows.append((parts[0].strip(), parts[1].strip()))
    if not rows:
        raise TriplesFormatError(f"{shown}: empty dictionary")
    id_second = all(b.lstrip("-").isdigit() for _, b in rows)
    id_first = all(a.lstrip("-").isdigit() for a, _ in rows)
    if not (id_second or id_first):
        raise TriplesFormatError(f"{shown}: no integer id column")
    mapping = {a: int(b) for a, b in rows} if id_second else {b: int(a) for a, b in rows}
    ids = sorted(mapping.values())
    if ids != list(range(len(ids))):
        raise TriplesFormatError(f"{shown}: ids must be 0..{len(ids) - 1} without gaps or repeats")
    return mapping


def read_labels(path: Path, files: FileAccess = LOCAL) -> dict[str, str]:
    """Read ``name<TAB>label`` display labels."""
    out: dict[str, str] = {}
    with open_text(files, Path(path), "triples") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t", 1)
            if len(parts) == 2 and parts[0].strip():
                out[parts[0].strip()] = parts[1].strip()
    return out


@dataclass
class Vocab:
    """Bidirectional name <-> id map."""

    names: list[str]
    index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def from_mapping(cls, mapping: dict[str, int]) -> Vocab:
        names = [""] * len(mapping)
        for name, i in mapping.items():
            names[i] = name
        return cls(names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def ids(self, names: Iterable[str]) -> list[int]:
        return [self.index[n] for n in names]


@dataclass
class TriplesDataset:
    """Triples as id tensors ``[n, 3]`` (head, relation, tail) with their vocabularies."""

    name: str
    entities: Vocab
    relations: Vocab
    splits: dict[str, torch.Tensor]
    entity_labels: dict[str, str] = field(default_factory=dict)
    relation_labels: dict[str, str] = field(default_factory=dict)

    @property
    def train(self) -> torch.Tensor:
        return self.splits["train"]

    @property
    def valid(self) -> torch.Tensor:
        return self.splits.get("valid", torch.empty(0, 3, dtype=torch.long))

    @property
    def test(self) -> torch.Tensor:
        return self.splits.get("test", torch.empty(0, 3, dtype=torch.long))

    def all_known(self) -> torch.Tensor:
        """Every known triple (all splits): the filter set of filtered ranking metrics."""
        return torch.cat([t for t in self.splits.values() if len(t)], 0)

    def encode(self, triples: Sequence[Sequence[str]]) -> torch.Tensor:
        """Names -> ids; raises ``KeyError`` naming the first unknown entity or relation."""
        out = []
        for h, r, t in triples:
            for n, vocab, kind in ((h, self.entities, "entity"), (r, self.relations, "relation"),
                                   (t, self.entities, "entity")):
                if n not in vocab:
                    raise KeyError(f"unknown {kind} {n!r}")
            out.append((self.entities.index[h], self.relations.index[r], self.entities.index[t]))
        return torch.tensor(out, dtype=torch.long).reshape(-1, 3)

    def decode(self, triples: torch.Tensor) -> list[list[str]]:
        return [[self.entities.names[h], self.relations.names[r], self.entities.names[t]]
                for h, r, t in triples.tolist()]

    def entity_label(self, name: str) -> str:
        return self.entity_labels.get(name, name)

    def relation_label(self, name: str) -> str:
        return self.relation_labels.get(name, name)


def load_triples_dir(path: Path | str, name: str | None = None, files: FileAccess = LOCAL) -> TriplesDataset:
    """Load a dataset directory (see the module docstring); every file is opened through ``files``."""
    path = Path(path)
    if not (path / "train.txt").exists():
        raise FileNotFoundError(f"{files.display(path)} has no train.txt")
    raw = {s: read_triples(path / f"{s}.txt", files) for s in SPLITS if (path / f"{s}.txt").exists()}
    if not raw["train"]:
        raise TriplesFormatError(f"{files.display(path / 'train.txt')}: no triples")
    if (path / "entities.dict").exists():
        entities = Vocab.from_mapping(read_id_dict(path / "entities.dict", files))
    else:
        entities = Vocab(sorted({e for rows in raw.values() for h, _, t in rows for e in (h, t)}))
    if (path / "relations.dict").exists():
        relations = Vocab.from_mapping(read_id_dict(path / "relations.dict", files))
    else:
        relations = Vocab(sorted({r for rows in raw.values() for _, r, _ in rows}))
    ds = TriplesDataset(name or path.name, entities, relations, {})
    for split, rows in raw.items():
        try:
            ds.splits[split] = ds.encode(rows)
        except KeyError as exc:
            raise TriplesFormatError(f"{files.display(path / (split + '.txt'))}: {exc.args[0]!r} is not in the "
                                     "dictionary") from exc
    if (path / "entity_labels.tsv").exists():
        ds.entity_labels = read_labels(path / "entity_labels.tsv", files)
    if (path / "relation_labels.tsv").exists():
        ds.relation_labels = read_labels(path / "relation_labels.tsv", files)
    return ds


def load_nations() -> TriplesDataset:
    return load_shipped("nations")


def load_umls() -> TriplesDataset:
    return load_shipped("umls")


def load_kinships() -> TriplesDataset:
    return load_shipped("kinships")


def write_triples(path: Path, rows: Iterable[Sequence[str]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for h, r, t in rows:
            fh.write(f"{h}\t{r}\t{t}\n")


def write_dataset_dir(ds: TriplesDataset, path: Path) -> None:
    """Write a dataset in the directory format (names, fixed id dictionaries, labels)."""
    path.mkdir(parents=True, exist_ok=True)
    for split, t in ds.splits.items():
        write_triples(path / f"{split}.txt", ds.decode(t))
    with open(path / "entities.dict", "w", encoding="utf-8") as fh:
        fh.writelines(f"{n}\t{i}\n" for i, n in enumerate(ds.entities.names))
    with open(path / "relations.dict", "w", encoding="utf-8") as fh:
        fh.writelines(f"{n}\t{i}\n" for i, n in enumerate(ds.relations.names))
    for fname, labels in (("entity_labels.tsv", ds.entity_labels), ("relation_labels.tsv", ds.relation_labels)):
        if labels:
            with open(path / fname, "w", encoding="utf-8") as fh:
                fh.writelines(f"{k}\t{v}\n" for k, v in labels.items())
