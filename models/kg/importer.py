"""Import a ConvE trained elsewhere into an explainq model directory (:mod:`models.kg.checkpoint`'s layout).

Inputs, all in one source directory:

- weights: a state dict as ``.safetensors`` or a weights-only ``.pt`` (the names of this project's ConvE, or of
  the reference ConvE code: ``emb_e``, ``emb_rel``, ``conv1``, ``b``, mapped here);
- the id files: the TracIn guide's ``node_dict`` / ``rel_dict``, PyKEEN's ``entity_to_id`` / ``relation_to_id``
  (``.tsv`` with an ``id<TAB>label`` header, ``.tsv.gz`` or ``.json``) or ``entities.dict`` / ``relations.dict``;
  ``name<TAB>id``, ``id<TAB>name`` and JSON ``{name: id}`` are read. Rows of the tables no name points to (a
  padding row, say) get the names ``__unused_<id>``;
- the shape hyper-parameters (``embedding_dim``, ``embedding_height``, ``num_filters``, ``kernel_size``...);
  the entity and relation counts come from the id files, and ``reciprocal`` from the relation table's rows;
- the training triples (names, or integer ids of the id files), needed by TracIn;
- one or more checkpoints, each with its learning rate (TracIn weights each checkpoint's dot products by it).

Every tensor's name and shape is checked against the config before anything is written
(:class:`models.weight_files.StateMismatch` names the tensors).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from models.kg.checkpoint import FORMAT
from models.kg.conve import ConvE, ConvEConfig
from models.kg.shapes import canonical_name
from models.kg.train import rank_metrics, ranks_from_scores
from models.kg.triples import TriplesDataset, Vocab, read_triples, write_dataset_dir
from models.weight_files import check_state, load_state_file

ENTITY_FILES = ("node_dict", "entity_to_id", "entities.dict", "entity2id")
RELATION_FILES = ("rel_dict", "relation_to_id", "relations.dict", "relation2id")
ID_SUFFIXES = ("", ".txt", ".tsv", ".tsv.gz", ".json", ".dict")
SHAPE_FIELDS = ("embedding_dim", "embedding_height", "num_filters", "kernel_size", "input_dropout",
                "feature_dropout", "hidden_dropout", "label_smoothing")


class ImportError_(ValueError):
    """A source directory that cannot be imported; the message names the file or field."""


def find_file(src: Path, given: str | None, stems: Sequence[str], what: str) -> Path:
    if given:
        path = src / given
        if not path.is_file():
            raise ImportError_(f"{what}: no file {given!r} in the model directory")
        return path
    for stem in stems:
        for suffix in ID_SUFFIXES:
            if (src / f"{stem}{suffix}").is_file():
                return src / f"{stem}{suffix}"
    raise ImportError_(f"{what}: none of {', '.join(stems)} (with {', '.join(s or 'no suffix' for s in ID_SUFFIXES)})"
                       " in the model directory")


def read_id_file(path: Path) -> dict[str, int]:
    """``{name: id}`` from a JSON object, or two tab-separated columns in either order (an ``id<TAB>label``
    header line is skipped); gzip when the name ends in ``.gz``."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    if path.name.endswith(".json") or text.lstrip().startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
            raise ImportError_(f"{path.name}: expected a JSON object of name -> integer id")
        return {str(k): int(v) for k, v in data.items()}
    rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    if rows and not any(c.strip().lstrip("-").isdigit() for c in rows[0]):
        rows = rows[1:]  # a header such as "id<TAB>label"
    if not rows or any(len(r) != 2 for r in rows):
        raise ImportError_(f"{path.name}: expected two tab-separated columns (name and id)")
    id_second = all(r[1].strip().lstrip("-").isdigit() for r in rows)
    id_first = all(r[0].strip().lstrip("-").isdigit() for r in rows)
    if not (id_second or id_first):
        raise ImportError_(f"{path.name}: no integer id column")
    if id_second:
        return {r[0].strip(): int(r[1]) for r in rows}
    return {r[1].strip(): int(r[0]) for r in rows}


def vocab_for_rows(mapping: dict[str, int], rows: int, what: str) -> Vocab:
    """Names for rows 0..rows-1 of an embedding table; ids must be unique and inside the table."""
    if len(set(mapping.values())) != len(mapping):
        raise ImportError_(f"{what}: two names share an id")
    bad = [n for n, i in mapping.items() if not 0 <= i < rows]
    if bad:
        raise ImportError_(f"{what}: ids of {bad[:3]} are outside the embedding table's {rows} rows")
    names = [f"__unused_{i}" for i in range(rows)]
    for name, i in mapping.items():
        names[i] = name
    return Vocab(names)


def rename(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This project's ConvE names from the reference code's (``emb_e`` -> ``ent``, ``b`` -> ``ent_bias``...)."""
    return {canonical_name(k): v for k, v in state.items()}


def _encode_triples(path: Path, ds: TriplesDataset) -> torch.Tensor:
    rows = read_triples(path)
    try:
        return ds.encode(rows)
    except KeyError:
        pass
    if all(x.lstrip("-").isdigit() for row in rows for x in row):  # integer ids of the id files
        t = torch.tensor([[int(x) for x in row] for row in rows], dtype=torch.long)
        if (t[:, [0, 2]] >= len(ds.entities)).any() or (t[:, 1] >= len(ds.relations)).any() or (t < 0).any():
            raise ImportError_(f"{path.name}: an id is outside the id files")
        return t
    unknown = next(x for row in rows for x, v in zip(row, (ds.entities, ds.relations, ds.entities), strict=True)
                   if x not in v)
    raise ImportError_(f"{path.name}: {unknown!r} is in neither id file")


def import_conve(src: Path, out: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Check and convert; writes ``out`` (a :mod:`models.kg.checkpoint` directory). Returns the import report."""
    src = Path(src)
    shape = dict(json.loads((src / "config.json").read_text())) if (src / "config.json").is_file() else {}
    shape = {k: v for k, v in {**shape, **(spec.get("config") or {})}.items() if k in SHAPE_FIELDS}
    weights_path = src / spec["weights"]
    state = rename(load_state_file(weights_path))
    if "ent.weight" not in state or "rel.weight" not in state:
        raise ImportError_(f"{spec['weights']}: no entity/relation tables (ent.weight/emb_e.weight, "
                           "rel.weight/emb_rel.weight)")
    n_ent, dim = state["ent.weight"].shape
    n_rel_rows = state["rel.weight"].shape[0]
    entities = vocab_for_rows(read_id_file(find_file(src, spec.get("entities"), ENTITY_FILES, "entities")),
                              n_ent, "entities")
    rel_map = read_id_file(find_file(src, spec.get("relations"), RELATION_FILES, "relations"))
    reciprocal = spec.get("reciprocal")
    if reciprocal is None:
        reciprocal = n_rel_rows == 2 * len(rel_map)
    n_rel = n_rel_rows // 2 if reciprocal else n_rel_rows
    relations = vocab_for_rows(rel_map, n_rel, "relations")
    shape.setdefault("embedding_dim", int(dim))
    if "embedding_height" not in shape:
        raise ImportError_("config.embedding_height: the image height of the embeddings is needed "
                           f"(embedding_dim {shape['embedding_dim']} = height x width)")
    try:
        config = ConvEConfig(num_entities=n_ent, num_relations=n_rel, reciprocal=bool(reciprocal), **shape)
    except (TypeError, ValueError) as exc:
        raise ImportError_(f"config: {exc}") from None
    model = ConvE(config)
    check_state(model, state, spec["weights"])
    model.load_state_dict(state, strict=False)
    model.eval()
    ds = TriplesDataset(spec.get("dataset_name") or src.name, entities, relations, {})
    for split, field in (("train", "train_triples"), ("valid", "valid_triples"), ("test", "test_triples")):
        if spec.get(field):
            path = src / spec[field]
            if not path.is_file():
                raise ImportError_(f"{field}: no file {spec[field]!r} in the model directory")
            ds.splits[split] = _encode_triples(path, ds)
    if "train" not in ds.splits:
        raise ImportError_("train_triples: TracIn needs the training triples")
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = []
    for i, ck in enumerate(spec["checkpoints"]):
        ck_state = rename(load_state_file(src / ck["file"]))
        check_state(model, ck_state, ck["file"])
        epoch = int(ck.get("epoch") if ck.get("epoch") is not None else i + 1)
        rel = f"checkpoints/epoch_{epoch:04d}.safetensors"
        (out / "checkpoints").mkdir(exist_ok=True)
        full = {k: v.contiguous() for k, v in {**model.state_dict(), **ck_state}.items()}
        save_file(full, str(out / rel), metadata={"epoch": str(epoch), "lr": repr(float(ck["lr"])), "format": FORMAT})
        checkpoints.append({"file": rel, "epoch": epoch, "lr": float(ck["lr"])})
    if len({c["epoch"] for c in checkpoints}) != len(checkpoints):
        raise ImportError_("checkpoints: two checkpoints have the same epoch")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": FORMAT})
    write_dataset_dir(ds, out / "data")
    smoke = smoke_test(model, ds.train[:64])
    cfg = {"format": FORMAT, "model": config.to_dict(), "dataset": ds.name,
           "training": {"imported_from": src.name, "weights": spec["weights"]}, "checkpoints": checkpoints}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "metrics.json").write_text(json.dumps({"smoke_train": smoke}, indent=2))
    return {"parameters": sum(p.numel() for p in model.parameters()), "entities": len(entities),
            "relations": n_rel, "reciprocal": bool(reciprocal), "train_triples": len(ds.train),
            "checkpoints": checkpoints, "smoke": smoke}


@torch.no_grad()
def smoke_test(model: ConvE, triples: torch.Tensor) -> dict[str, Any]:
    """Tail-prediction ranks (unfiltered) of a few training triples: a trained model ranks them high."""
    scores = model(triples[:, 0], triples[:, 1])
    ranks = ranks_from_scores(scores, triples[:, 2], torch.zeros_like(scores, dtype=torch.bool))
    return {"triples": len(triples), **rank_metrics(ranks.float())}
