"""The functions the bounded parser runs (:data:`core.bounded.PARSERS`): each reads a user file's content in the
bounded child process, never in the API. Each takes the settings and JSON arguments and returns JSON-able data;
a :class:`~core.contract.errors.FieldError` it raises reaches the API as it is. No torch.

They wrap the readers the API used to call in its own process (:mod:`core.dataset_formats`,
:mod:`models.kg.tsv`, :mod:`models.weight_files`, :mod:`models.hf.files`, :mod:`models.export.files`,
:mod:`models.lora.keys`), so a file reads and fails exactly as before, only elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.userfiles import UserFiles

if TYPE_CHECKING:
    from core.settings import Settings


def detect_dataset(settings: Settings, path: str) -> dict[str, Any]:
    """``{"found": detect(...)}``, or ``{"format_error": message}`` / ``{"os_error": strerror}``."""
    from core.dataset_formats import FormatError, detect

    try:
        return {"found": detect(Path(path), UserFiles(settings))}
    except FormatError as exc:
        return {"format_error": str(exc)}
    except OSError as exc:
        return {"os_error": exc.strerror or "I/O error"}


def classifier_counts(settings: Settings, path: str, tensors: bool) -> dict[str, Any]:
    """A classifier dataset's splits: ``{"counts"}``, or ``{"error": message}``."""
    from core.dataset_formats import FormatError, summarize_text, tensor_splits
    from models.textdata import TextDataError

    try:
        reader = tensor_splits if tensors else summarize_text
        return {"counts": reader(Path(path), UserFiles(settings))}
    except (FormatError, TextDataError) as exc:
        return {"error": str(exc)}


def lora_summary(settings: Settings, path: str) -> dict[str, Any]:
    """A LoRA dataset's header-only summary: ``{"classes", "layers", "num_layers"}``, or ``{"format_error"}`` /
    ``{"os_error"}``."""
    from models.lora.keys import DatasetFormatError, summarize_dataset

    try:
        summary = summarize_dataset(Path(path))
    except DatasetFormatError as exc:
        return {"format_error": str(exc)}
    except OSError as exc:
        return {"os_error": str(exc)}
    return {"classes": list(summary.classes), "layers": len(summary.layers), "num_layers": summary.num_layers}


def news_labelled(settings: Settings, entry: dict[str, Any], split: str) -> bool | None:
    from core.dataset_formats import news_labelled as labelled

    return labelled(settings, entry, split)


def read_test_triples(settings: Settings, path: str, value: str, max_rows: int) -> dict[str, Any]:
    """A TracIn request's ``test_triples_path``: ``{"rows"}``, or ``{"error": message}``."""
    from core.userfiles import PathError, UserFileError
    from models.kg.tsv import TriplesFormatError, read_triples

    try:
        rows = read_triples(Path(path), UserFiles(settings), fmt="test_triples", max_rows=max_rows)
    except (PathError, UserFileError, TriplesFormatError) as exc:
        return {"error": str(exc)}
    except UnicodeDecodeError:
        return {"error": "the file is not UTF-8 text"}
    except OSError as exc:  # no permission...
        return {"error": f"cannot read {value!r}: {exc.strerror or 'I/O error'}"}
    return {"rows": [list(r) for r in rows]}


def _import_request(request: dict[str, Any]) -> Any:
    from core.kinds.import_model import ImportModelRequest

    return ImportModelRequest.model_validate(request)


def conve_headers(settings: Settings, request: dict[str, Any], directory: str) -> None:
    """The ConvE import's weight headers against its config (FieldErrors as :mod:`core.kinds.import_model`)."""
    from core.kinds.import_model import _conve_header_check

    _conve_header_check(_import_request(request), Path(directory), UserFiles(settings))


def news_pretrained(settings: Settings, request: dict[str, Any], directory: str) -> None:
    from core.kinds.import_model import _check_pretrained

    _check_pretrained(_import_request(request), Path(directory), UserFiles(settings))


def hf_parameters(settings: Settings, directory: str, raw: str) -> int:
    """The parameters of a Hugging Face checkpoint, read as data (:func:`core.kinds.import_model.inspect_hf`)."""
    from core.kinds.import_model import inspect_hf

    return int(inspect_hf(settings, Path(directory), raw).parameters)


def export_nbytes(settings: Settings, directory: str, request: dict[str, Any]) -> int:
    """The weight bytes of an exported program, its archive and spec checked
    (:func:`core.kinds.import_model.inspect_export`)."""
    from core.kinds.import_model import inspect_export

    info, _ = inspect_export(settings, Path(directory), _import_request(request))
    return int(info.nbytes)


def kfac_problem(settings: Settings, path: str) -> dict[str, Any]:
    """Why EK-FAC cannot run on the stored program at ``path``: ``{"problem": str | None}``, or ``{}`` when the
    archive cannot be read here."""
    from models.export.files import ProgramError, inspect_program
    from models.export.kfac import layers_problem

    try:
        info = inspect_program(Path(path))
    except (ProgramError, OSError):
        return {}
    return {"problem": layers_problem(info)}


# ------------------------------------------------------------------------------------------ a registered model's files
def _model_file(settings: Settings, entry: dict[str, Any], relname: str) -> bytes:
    """One file of a registered model, read here (in the child); a file too large for the child's memory is a 413
    naming it as ``<model>/<file>`` (never a server path)."""
    from core import registry

    try:
        return registry.read_file(settings, entry, relname)
    except MemoryError:
        raise _too_large(settings, entry, relname) from None


def _too_large(settings: Settings, entry: dict[str, Any], relname: str) -> Exception:
    import resource

    from core.bounded import _gib
    from core.contract.errors import FieldTooLarge

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]  # the child's address-space limit (EXPLAINQ_PARSER_MEMORY_BYTES)
    return FieldTooLarge(("body", "model"), f"{entry.get('name')}/{relname}: reading it needed more than "
                         f"{_gib(limit)} of memory (EXPLAINQ_PARSER_MEMORY_BYTES)",
                         value=entry.get("name"))


def _store_down(exc: Any) -> dict[str, Any]:
    return {"store_unavailable": [exc.operation, exc.key, exc.attempts, exc.cause]}


def raise_if_store_down(answer: Any) -> None:
    """In the API: raise again the :class:`~core.filestore.StoreUnavailable` a model-file parser met (a 503)."""
    if isinstance(answer, dict) and "store_unavailable" in answer:
        from core.filestore import StoreUnavailable

        operation, key, attempts, cause = answer["store_unavailable"]
        raise StoreUnavailable(operation, key, int(attempts), type(str(cause), (Exception,), {})())


def _id_names(text: str) -> list[str]:
    """Names of an id dictionary (``name<TAB>id``, or ``id<TAB>name``)."""
    rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    if all(len(r) == 2 and r[1].strip().lstrip("-").isdigit() for r in rows):
        return sorted({r[0].strip() for r in rows})
    return sorted({r[1].strip() for r in rows})


def model_vocab(settings: Settings, entry: dict[str, Any]) -> dict[str, Any]:
    """A ConvE model's ``{"entities", "relations", "checkpoints"}`` (names, sorted), from its config.json and id
    dictionaries; ``{"missing": True}`` when they are not in the store, ``{"error": message}`` when one cannot be
    read as it should."""
    from core.contract.errors import FieldError
    from core.filestore import StoreError, StoreUnavailable

    name = entry.get("name")
    try:
        files = {rel: _model_file(settings, entry, rel)
                 for rel in ("config.json", "data/entities.dict", "data/relations.dict")}
    except (FileNotFoundError, StoreError):
        return {"missing": True}
    except StoreUnavailable as exc:
        return _store_down(exc)
    except OSError as exc:
        return {"error": f"model {name!r}: its files cannot be read ({exc.strerror or 'I/O error'})"}
    try:
        cfg = json.loads(files.pop("config.json"))
    except MemoryError:
        raise _too_large(settings, entry, "config.json") from None
    except ValueError:
        cfg = None
    ckpts = cfg.get("checkpoints", []) if isinstance(cfg, dict) else None
    if not isinstance(ckpts, list) or not all(isinstance(c, dict) and "file" in c and "epoch" in c for c in ckpts):
        raise FieldError(("body", "model"), f"{name}/config.json is not a model configuration (JSON with a list "
                         "of checkpoints)", value=name)
    checkpoints = {Path(str(c["file"])).stem for c in ckpts} | {Path(str(c["file"])).name for c in ckpts} \
        | {str(c["epoch"]) for c in ckpts}
    out: dict[str, Any] = {"checkpoints": sorted(checkpoints)}
    for field, rel in (("entities", "data/entities.dict"), ("relations", "data/relations.dict")):
        try:
            out[field] = _id_names(files.pop(rel).decode("utf-8"))
        except MemoryError:
            raise _too_large(settings, entry, rel) from None
        except UnicodeDecodeError:
            raise FieldError(("body", "model"), f"{name}/{rel} is not UTF-8 text", value=name) from None
    return out


def _model_json(settings: Settings, entry: dict[str, Any], relname: str) -> Any:
    """A small JSON file of a registered model, or None when it is missing or not JSON (the worker decides)."""
    from core.filestore import StoreError

    try:
        text = _model_file(settings, entry, relname)
    except (StoreError, OSError):
        return None
    try:
        return json.loads(text)
    except MemoryError:
        del text
        raise _too_large(settings, entry, relname) from None
    except ValueError:
        return None


def model_class_names(settings: Settings, entry: dict[str, Any]) -> Any:
    """A classifier's class names in logit order from its config.json's ``id2label``; None when it cannot be read
    or holds none (``{"store_unavailable"}`` when the store did not answer)."""
    from core.filestore import StoreUnavailable

    try:
        config = _model_json(settings, entry, "config.json")
    except StoreUnavailable as exc:
        return _store_down(exc)
    id2label = config.get("id2label") if isinstance(config, dict) else None
    if isinstance(id2label, dict) and id2label:
        try:
            ordered = sorted((int(k), str(v)) for k, v in id2label.items())
        except (TypeError, ValueError):
            return None
        if [k for k, _ in ordered] == list(range(len(ordered))):
            return [v for _, v in ordered]
    return None


def model_tokenizer_has(settings: Settings, entry: dict[str, Any], token: str) -> Any:
    """Whether a classifier's tokenizer defines ``token`` (``pad``, ``mask``), from tokenizer_config.json or
    special_tokens_map.json (what transformers reads it from); None when neither can be read."""
    from core.filestore import StoreUnavailable

    seen = False
    for relname in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            cfg = _model_json(settings, entry, relname)
        except StoreUnavailable as exc:
            return _store_down(exc)
        if not isinstance(cfg, dict):
            continue
        seen = True
        value = cfg.get(f"{token}_token")
        if isinstance(value, str) and value or isinstance(value, dict) and value.get("content"):
            return True
    return False if seen else None
