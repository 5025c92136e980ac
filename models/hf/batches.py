"""Texts of a Hugging Face sequence classifier as Integrated Gradients inputs (shared by the attributions,
:mod:`models.hf.attribution`, and the faithfulness curves, :mod:`models.hf.faithfulness`): tokenised and grouped
into words (:func:`prepare`), batched by token length so that nothing is padded (:func:`length_batches`), and for one
batch the inputs, the baselines and the attributed function, the target class's logit (:func:`build_batch`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from models.hf.checkpoint import HFClassifier
from models.news.attribution import word_spans
from models.news.text import NewsTokenizer, structural_ids

VIEW = "text"  # the one view of a text classifier's records (``summary.views``, ``n_steps`` per view)
BASELINES = ("pad", "mask", "zero")
# model types whose position ids start after the padding index (RoBERTa's create_position_ids_from_input_ids)
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet")
DEFAULT_MAX_TOKENS = 512


@dataclass
class TextSample:
    """One text to explain: ``target`` a class index or name (None: the predicted class); ``label`` the caller's
    own label of the text (groups the word statistics)."""

    id: str
    text: str
    label: str | None = None
    target: int | str | None = None


def resolve_target(labels: Sequence[str], target: int | str | None) -> int | None:
    """The class index of ``target`` (an index or a class name; None stays None), or ValueError saying why not."""
    if target is None:
        return None
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise ValueError(f"target must be a class index or a class name, got {target!r}")
    if isinstance(target, int):
        if not 0 <= target < len(labels):
            raise ValueError(f"target {target} is not a class index of the model (0..{len(labels) - 1})")
        return target
    if target not in labels:
        shown = ", ".join(repr(v) for v in list(labels)[:20]) + (", ..." if len(labels) > 20 else "")
        raise ValueError(f"target {target!r} is not a class of the model ({shown})")
    return list(labels).index(target)


def item_target(labels: Sequence[str], item_id: str, own: int | str | None,
                targets: Mapping[str, str] | None) -> tuple[int | None, str]:
    """The class an item's record explains and where it comes from: ``model`` (``targets``, by name: a
    ``compare_with`` pass explains the class the first model's record explains), ``request`` (the item's own
    target) or ``predicted`` (None: the model's predicted class). ValueError for a class the model lacks."""
    if targets is not None and item_id in targets:
        return resolve_target(labels, targets[item_id]), "model"
    target = resolve_target(labels, own)
    return target, "predicted" if target is None else "request"


def baseline_token(clf: HFClassifier, baseline: str) -> int | None:
    """The token id the baseline puts at content positions (None for ``zero``), or ValueError when the tokenizer
    has no such token."""
    if baseline == "zero":
        return None
    name = "pad" if baseline == "pad" else "mask"
    tid = getattr(clf.tokenizer, f"{name}_token_id", None)
    if tid is None:
        raise ValueError(f"baseline {baseline!r}: the model's tokenizer has no {name} token; choose "
                         + " or ".join(repr(b) for b in BASELINES if b != baseline))
    return int(tid)


def max_tokens(clf: HFClassifier) -> int:
    """The most tokens the model reads: its tokenizer's ``model_max_length`` when set, and its position table
    (less the padding offset of RoBERTa-style positions)."""
    cfg = clf.model.config
    found = []
    declared = getattr(clf.tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:
        found.append(declared)
    positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if isinstance(positions, int) and positions > 0:
        if cfg.model_type in POSITIONS_AFTER_PADDING:
            positions -= int(getattr(cfg, "pad_token_id", None) or 0) + 1
        found.append(positions)
    return max(1, min(found)) if found else DEFAULT_MAX_TOKENS


def logits_from_embeddings(clf: HFClassifier) -> Callable[[torch.Tensor], torch.Tensor]:
    """``logits(e)``: ``(M, C)`` class logits of ``M`` unpadded sequences given their token embeddings ``e``
    ``(M, L, D)`` (every position attended; position and token-type embeddings added by the model).

    A GPT-2 classifier without a padding token refuses batches of more than one sequence (it cannot tell where
    each one ends); with no padding the answer is the last position, so its transformer and score head are called
    directly, exactly as ``GPT2ForSequenceClassification.forward`` does."""
    model = clf.model
    cfg = model.config
    extra = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    if cfg.model_type == "gpt2" and getattr(cfg, "pad_token_id", None) is None:
        def last_position(e: torch.Tensor) -> torch.Tensor:
            mask = torch.ones(e.shape[:2], dtype=torch.long, device=e.device)
            hidden = model.transformer(inputs_embeds=e, attention_mask=mask, use_cache=False).last_hidden_state
            return model.score(hidden[:, -1])
        return last_position

    def logits(e: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(e.shape[:2], dtype=torch.long, device=e.device)
        return model(inputs_embeds=e, attention_mask=mask, **extra).logits

    return logits


class _Words(NewsTokenizer):
    """The news pipeline's word grouping (:meth:`NewsTokenizer.group_words`) over a classifier's fast tokenizer."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.special_ids = structural_ids(hf)
        self.pad_id = int(hf.pad_token_id) if hf.pad_token_id is not None else -1

    def join_pieces(self, pieces: Sequence[str]) -> str:
        return self.hf.convert_tokens_to_string(list(pieces))

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        return list(self.hf.convert_ids_to_tokens([int(i) for i in ids]))


# ------------------------------------------------------------------------------------------------ preparation
@dataclass
class Prepared:
    """One tokenised text: its ids and tokens, which positions are content (differ from the baseline), its words
    (token positions each), each token's character span, whether it was truncated, and the class asked for."""

    index: int  # position in the request
    sample: TextSample
    ids: list[int]
    tokens: list[str]
    content: list[bool]
    words: list[tuple[str, list[int]]]
    offsets: list[tuple[int, int] | None]
    truncated: bool
    target: int | None  # the requested class (None: the predicted one)
    target_source: str  # "request", "predicted" or "model" (the class the compared model's record explains)


def prepare(clf: HFClassifier, samples: Sequence[TextSample], errors: list[dict[str, Any]],
            targets: Mapping[str, str] | None = None) -> list[Prepared]:
    """Tokenise every text (at most :func:`max_tokens` tokens); a text with no content token or an unknown target
    becomes an error. ``targets`` (id -> class name) overrides the texts' own targets (a ``compare_with`` pass
    explains the class the model's record explains)."""
    tok = clf.tokenizer
    words_of = _Words(tok)
    limit = max_tokens(clf)
    out = []
    for i, s in enumerate(samples):
        if not isinstance(s.text, str) or not s.text.strip():
            errors.append({"id": s.id, "error": "text must be a non-empty string"})
            continue
        try:
            target, source = item_target(clf.labels, s.id, s.target, targets)
        except ValueError as exc:
            errors.append({"id": s.id, "error": str(exc)})
            continue
        enc = tok(s.text, truncation=True, max_length=limit, return_offsets_mapping=True)
        ids = [int(t) for t in enc["input_ids"]]
        word_ids = enc.word_ids()
        content = [w is not None and t not in words_of.special_ids for t, w in zip(ids, word_ids, strict=True)]
        if not any(content):
            errors.append({"id": s.id, "error": "text has no tokens after tokenisation"})
            continue
        tokens = words_of.convert_ids_to_tokens(ids)
        offsets = [(int(a), int(b)) if w is not None else None
                   for (a, b), w in zip(enc["offset_mapping"], word_ids, strict=True)]
        words = words_of.group_words(tokens, ids, word_ids)
        truncated = bool(enc.encodings[0].overflowing) if enc.encodings else False
        out.append(Prepared(i, s, ids, tokens, content, words, offsets, truncated, target, source))
    return out


def trimmed_spans(text: str, words: Sequence[tuple[str, list[int]]], offsets: Sequence[tuple[int, int] | None]
                  ) -> list[tuple[int, int] | None]:
    """Each word's character span (:func:`models.news.attribution.word_spans`) without surrounding white space."""
    out: list[tuple[int, int] | None] = []
    for sp in word_spans(words, offsets):
        if sp is None:
            out.append(None)
            continue
        a, b = sp
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        out.append((a, b))
    return out


# ------------------------------------------------------------------------------------------------ one batch
@dataclass
class Batch:
    """Texts of one token length: inputs ``x`` and baselines ``base`` ``(n, L, D)`` (fp32 embeddings), the content
    positions ``(n, L)``, each text's target class and ``forward(x, rows)``: the target logit of the text each row
    belongs to (the engine's :data:`models.explain.ig.ForwardFn`)."""

    items: list[Prepared]
    x: torch.Tensor
    base: torch.Tensor
    content: torch.Tensor
    targets: torch.Tensor
    logits: Callable[[torch.Tensor], torch.Tensor]

    def forward(self, xs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = self.logits(xs)
        return out.gather(1, self.targets[rows].to(out.device)[:, None])[:, 0].float()

    @torch.no_grad()
    def endpoint_logits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All class logits at ``x`` and at ``x'`` ``(n, C)`` each, fp64 on CPU, from one fp32 forward."""
        n = self.x.shape[0]
        out = self.logits(torch.cat([self.x, self.base]).float()).double().cpu()
        return out[:n], out[n:]


def build_batch(clf: HFClassifier, items: Sequence[Prepared], baseline: str,
                logits: Callable[[torch.Tensor], torch.Tensor], targets: Sequence[int] | None = None) -> Batch:
    """The inputs, baselines and attributed function of texts of one token length (``targets``: each text's class;
    default 0 until :func:`_targets` sets them)."""
    lengths = {len(p.ids) for p in items}
    if len(lengths) != 1:
        raise ValueError(f"a batch holds texts of one token length, got {sorted(lengths)}")
    dev = clf.device
    ids = torch.tensor([p.ids for p in items], dtype=torch.long, device=dev)
    content = torch.tensor([p.content for p in items], dtype=torch.bool, device=dev)
    table = clf.embeddings()
    with torch.no_grad():
        x = table(ids).float()
        token = baseline_token(clf, baseline)
        if token is None:
            base = torch.where(content[..., None], torch.zeros_like(x), x)
        else:
            base = table(torch.where(content, torch.full_like(ids, token), ids)).float()
    t = torch.tensor(list(targets) if targets is not None else [0] * len(items), dtype=torch.long, device=dev)
    return Batch(list(items), x, base, content, t, logits)


def length_batches(prepared: Sequence[Prepared], batch_size: int) -> list[list[Prepared]]:
    """The texts grouped by token length (shortest first, request order within a length), each group cut into
    batches of at most ``batch_size``."""
    groups: dict[int, list[Prepared]] = {}
    for p in sorted(prepared, key=lambda p: (len(p.ids), p.index)):
        groups.setdefault(len(p.ids), []).append(p)
    return [g[i:i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
