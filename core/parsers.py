"""The functions the bounded parser runs (:data:`core.bounded.PARSERS`): each reads a user file's content in the
bounded child process, never in the API. Each takes the settings and JSON arguments and returns JSON-able data;
a :class:`~core.contract.errors.FieldError` it raises reaches the API as it is. No torch.

They wrap the readers the API used to call in its own process (:mod:`core.dataset_formats`,
:mod:`models.kg.tsv`, :mod:`models.weight_files`, :mod:`models.hf.files`, :mod:`models.export.files`,
:mod:`models.lora.keys`), so a file reads and fails exactly as before, only elsewhere.
"""

from __future__ import annotations

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
