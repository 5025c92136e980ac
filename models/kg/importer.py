"""Import a ConvE trained elsewhere into an explainq model directory (:mod:`models.kg.checkpoint`'s layout).

Inputs, all in one source directory:

- weights: a state dict as ``.safetensors`` or a weights-only ``.pt`` (the names of this project's ConvE, of
  the reference ConvE code: ``emb_e``, ``emb_rel``, ``conv1``, ``b``, or of PyKEEN's ConvE, all mapped here), or a
  training-loop checkpoint holding ``model_state_dict`` (PyKEEN's is read by an allow-listed unpickler, see
  :func:`models.weight_files.load_checkpoint_pickle`). A PyKEEN ConvE's relation rows are reordered from PyKEEN's
  interleaved inverse layout (:func:`from_pykeen`); a pickled PyKEEN model is refused with the line that exports
  its state dict;
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

import functools
import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from models.files import LocalFiles
from models.kg.checkpoint import FORMAT
from models.kg.conve import ConvE, ConvEConfig
from models.kg.shapes import (
    PYKEEN_BIAS,
    canonical_name,
    infer_height,
    is_pykeen,
    pykeen_problem,
    pykeen_shapes,
)
from models.kg.train import evaluate, rank_metrics, ranks_from_scores
from models.kg.triples import TriplesDataset, Vocab, read_triples, write_dataset_dir
from models.weight_files import check_state, load_state_file

if TYPE_CHECKING:
    from models.bounded_load import LoadBounds

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
    for folder in ("", "training_triples/"):  # PyKEEN's pipeline result directory keeps its maps there
        for stem in stems:
            for suffix in ID_SUFFIXES:
                if (src / f"{folder}{stem}{suffix}").is_file():
                    return src / f"{folder}{stem}{suffix}"
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


def from_pykeen(state: dict[str, torch.Tensor], relations: int, source: str,
                reciprocal: bool | None = None) -> dict[str, torch.Tensor]:
    """A PyKEEN ConvE state dict in this project's names and layout (``models.kg.shapes.PYKEEN_PREFIXES``).

    ``relations``: the number of base relations (PyKEEN's ``relation_to_id``). Trained with
    ``create_inverse_triples=True`` PyKEEN holds 2R relation rows, forward r at row 2r and its inverse at 2r+1; this
    project holds forward r at row r and the inverse at r + R, so the rows are reordered. R rows: no inverses.
    """
    problem = pykeen_problem({k: tuple(v.shape) for k, v in state.items()})
    if problem:
        raise ImportError_(f"{source}: {problem}")
    rows = state["relation_representations.0._embeddings.weight"].shape[0]
    if rows == 2 * relations:
        if reciprocal is False:
            raise ImportError_(f"{source}: the PyKEEN model holds {rows} relation rows for {relations} relations "
                               "(trained with create_inverse_triples=True), but reciprocal is false")
        interleaved = True
    elif rows == relations:
        if reciprocal:
            raise ImportError_(f"{source}: the PyKEEN model holds one relation row per relation (trained without "
                               "inverse triples), but reciprocal is true")
        interleaved = False
    else:
        raise ImportError_(f"{source}: the PyKEEN model holds {rows} relation rows; the relation map names "
                           f"{relations} relations (expected {relations}, or {2 * relations} with "
                           "create_inverse_triples=True): is it the map of the same TriplesFactory?")
    out = {}
    for name, tensor in state.items():
        if name == PYKEEN_BIAS:
            out["ent_bias"] = tensor.reshape(-1)
            continue
        (new,) = pykeen_shapes({name: ()})
        if new == "rel.weight" and interleaved:  # PyKEEN [f0, i0, f1, i1, ...] -> [f0, f1, ..., i0, i1, ...]
            tensor = torch.cat([tensor[0::2], tensor[1::2]])
        out[new] = tensor
    return out


def _pykeen_shape(state: dict[str, torch.Tensor], shape: dict[str, Any], source: str) -> None:
    """Fill the shape fields a PyKEEN ConvE's tensors fix (filters, kernel, image height) unless given."""
    filters, _, k, _ = state["conv.weight"].shape
    shape.setdefault("num_filters", int(filters))
    shape.setdefault("kernel_size", int(k))
    if "embedding_height" not in shape:
        dim = int(state["ent.weight"].shape[1])
        heights = infer_height(dim, int(state["fc.weight"].shape[1]), int(filters), int(k))
        if len(heights) != 1:
            raise ImportError_(f"{source}: config.embedding_height: the PyKEEN ConvE's image height cannot be told "
                               f"from its tensors (candidates {heights}); give PyKEEN's embedding_height")
        shape["embedding_height"] = heights[0]


def _load(path: Path, name: str, relations: int | None, reciprocal: bool | None, bounds: LoadBounds | None = None,
          shown: str | None = None, loaded: dict[Path, dict] | None = None) -> tuple[dict, bool]:
    """A state dict in this project's names; PyKEEN's are recognised and converted. Returns (state, is PyKEEN).
    ``loaded``: the files this import already read (the weights are often the last checkpoint too), by path."""
    from models.bounded_load import LoadRefused

    try:
        if loaded is not None and path in loaded:
            raw = dict(loaded[path])
        else:
            raw = load_state_file(path, bounds=bounds, shown=_shown(shown, name))
            if loaded is not None:
                loaded[path] = dict(raw)
    except LoadRefused:
        raise
    except ValueError as exc:
        raise ImportError_(str(exc)) from None
    if not is_pykeen(raw):
        return rename(raw), False
    if relations is None:
        raise ImportError_(f"{name}: a PyKEEN ConvE needs its relation map (relation_to_id)")
    return from_pykeen(raw, relations, f"{name} (PyKEEN ConvE)", reciprocal), True


def _shown(directory: str | None, name: str) -> str:
    return f"{directory}/{name}" if directory and directory != "." else name


def checkpoint_maps(path: Path, bounds: LoadBounds | None = None, shown: str | None = None
                    ) -> dict[str, dict[str, int]]:
    """:func:`checkpoint_maps_here` run in the bounded child (:mod:`models.bounded_load`): the file is a tenant's."""
    from models.bounded_load import checkpoint_maps as bounded
    from models.weight_files import PICKLE_SUFFIXES

    if path.suffix not in PICKLE_SUFFIXES or not path.is_file():
        return {}
    return bounded(path, bounds, _shown(shown, path.name))


def checkpoint_maps_here(path: Path) -> dict[str, dict[str, int]]:
    """``{"entities": ..., "relations": ...}`` from a PyKEEN training-loop checkpoint's ``entity_to_id_dict`` /
    ``relation_to_id_dict`` (empty when the file is not such a checkpoint)."""
    from models.weight_files import PICKLE_SUFFIXES, load_checkpoint_pickle

    if path.suffix not in PICKLE_SUFFIXES or not path.is_file():
        return {}
    try:
        ck = load_checkpoint_pickle(path)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - not a checkpoint this reader accepts: no maps
        return {}
    out = {}
    for what, key in (("entities", "entity_to_id_dict"), ("relations", "relation_to_id_dict")):
        m = ck.get(key)
        if isinstance(m, dict) and m and all(isinstance(k, str) and type(v) is int for k, v in m.items()):
            out[what] = dict(m)
    return out


def _id_map(src: Path, given: str | None, stems: Sequence[str], what: str,
            maps: Callable[[], dict[str, dict[str, int]]]) -> dict[str, int]:
    """An id file, or, when there is none, the map a PyKEEN training-loop checkpoint (the weights) holds
    (``maps``: that checkpoint's maps, read once)."""
    try:
        return read_id_file(find_file(src, given, stems, what))
    except ImportError_:
        if given:
            raise
        found = maps().get(what)
        if found is None:
            raise
        return found


class _ByName(LocalFiles):
    """Local reads named by the file's name alone, as this module's other messages name files (a message reaches
    the job's error, which must not show the server's directories)."""

    def display(self, path: Path) -> str:
        return Path(path).name


def _encode_triples(path: Path, ds: TriplesDataset) -> torch.Tensor:
    rows = read_triples(path, _ByName())
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


def import_conve(src: Path, out: Path, spec: dict[str, Any], bounds: LoadBounds | None = None,
                 shown: str | None = None) -> dict[str, Any]:
    """Check and convert; writes ``out`` (a :mod:`models.kg.checkpoint` directory). Returns the import report.
    Every pickle is read in the bounded child (``bounds``, :mod:`models.bounded_load`); ``shown`` names ``src`` in
    the messages of a load past a bound (relative to the data roots)."""
    src = Path(src)
    shape = dict(json.loads((src / "config.json").read_text())) if (src / "config.json").is_file() else {}
    shape = {k: v for k, v in {**shape, **(spec.get("config") or {})}.items() if k in SHAPE_FIELDS}
    weights_path = src / spec["weights"]
    maps = functools.cache(lambda: checkpoint_maps(weights_path, bounds, shown))
    rel_map = _id_map(src, spec.get("relations"), RELATION_FILES, "relations", maps)
    reciprocal = spec.get("reciprocal")
    loaded: dict[Path, dict] = {}  # each file is read once (a bounded load starts a child)
    state, pykeen = _load(weights_path, spec["weights"], len(rel_map), reciprocal, bounds, shown, loaded)
    whose = f"{spec['weights']} (PyKEEN ConvE)" if pykeen else spec["weights"]
    if "ent.weight" not in state or "rel.weight" not in state:
        raise ImportError_(f"{spec['weights']}: no entity/relation tables (ent.weight/emb_e.weight, "
                           "rel.weight/emb_rel.weight, or PyKEEN's entity_representations/relation_representations)")
    n_ent, dim = state["ent.weight"].shape
    n_rel_rows = state["rel.weight"].shape[0]
    entities = vocab_for_rows(_id_map(src, spec.get("entities"), ENTITY_FILES, "entities", maps),
                              n_ent, "entities")
    if reciprocal is None:
        reciprocal = n_rel_rows == 2 * len(rel_map)
    n_rel = n_rel_rows // 2 if reciprocal else n_rel_rows
    relations = vocab_for_rows(rel_map, n_rel, "relations")
    if pykeen:
        _pykeen_shape(state, shape, whose)
    shape.setdefault("embedding_dim", int(dim))
    if "embedding_height" not in shape:
        raise ImportError_("config.embedding_height: the image height of the embeddings is needed "
                           f"(embedding_dim {shape['embedding_dim']} = height x width)")
    try:
        config = ConvEConfig(num_entities=n_ent, num_relations=n_rel, reciprocal=bool(reciprocal), **shape)
    except (TypeError, ValueError) as exc:
        raise ImportError_(f"config: {exc}") from None
    model = ConvE(config)
    check_state(model, state, whose)
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
        ck_state, ck_pykeen = _load(src / ck["file"], ck["file"], len(rel_map), bool(reciprocal), bounds, shown,
                                    loaded)
        check_state(model, ck_state, f"{ck['file']} (PyKEEN ConvE)" if ck_pykeen else ck["file"])
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
    # filtered MRR / Hits@k (both sides, ties count half) on the valid/test triples given: comparable with the
    # source's own evaluation (PyKEEN's RankBasedEvaluator, filtered, realistic rank)
    metrics = evaluate(model, ds, ("valid", "test"))
    cfg = {"format": FORMAT, "model": config.to_dict(), "dataset": ds.name,
           "training": {"imported_from": src.name, "weights": spec["weights"]}, "checkpoints": checkpoints}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "metrics.json").write_text(json.dumps({"smoke_train": smoke, **metrics}, indent=2))
    return {"parameters": sum(p.numel() for p in model.parameters()), "entities": len(entities), "pykeen": pykeen,
            "relations": n_rel, "reciprocal": bool(reciprocal), "train_triples": len(ds.train),
            "checkpoints": checkpoints, "smoke": smoke, **({"metrics": metrics} if metrics else {})}


@torch.no_grad()
def smoke_test(model: ConvE, triples: torch.Tensor) -> dict[str, Any]:
    """Tail-prediction ranks (unfiltered) of a few training triples: a trained model ranks them high."""
    scores = model(triples[:, 0], triples[:, 1])
    ranks = ranks_from_scores(scores, triples[:, 2], torch.zeros_like(scores, dtype=torch.bool))
    return {"triples": len(triples), **rank_metrics(ranks.float())}
