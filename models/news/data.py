"""News data: MIND files, the pairwise benchmark CSV, inline samples and a deterministic synthetic generator.

MIND layout (one directory per split)::

    news.tsv       news_id  category  subcategory  title  abstract  url  title_entities  abstract_entities
    behaviors.tsv  impression_id  user_id  time  history(space-separated ids)  impressions("N1-1 N2-0")

MIND has no fake-news label; the synthetic generator writes it as a sidecar ``labels.tsv`` (``news_id  real|fake``)
next to ``news.tsv``. Without the sidecar every item's label is ``None`` (unlabelled), never a guessed ``real``.
An impression token without a click label (``N123`` instead of ``N123-1``, as in MIND's test split) is read with
the label ``None``. A token with another suffix (``N1-2``) is also read as unlabelled, and counted: the split's
``warnings`` say how many there were. Files are read through a ``files`` access (:mod:`models.files`): UTF-8, a
leading byte-order mark dropped, and errors name the file (relative to the data roots in the service) and line.
Every news id an impression names, in its history or among its candidates, must be in ``news.tsv``: MIND's own
tools (the ``nid2index`` lookup of its data loaders) fail on a missing id, and so does :func:`read_mind`, with the
file, line and ids, rather than silently dropping history.

The pairwise CSV needs the columns ``user_id, history_titles, candidate_id, candidate_title``; ``label`` (click),
``candidate_is_fake``, ``history_bodies`` and ``candidate_body`` are optional (an empty cell is unlabelled).
``history_titles`` and ``history_bodies`` are JSON lists (a ``" ||| "``-joined string is also read).

Sampling reads ``behaviors.tsv`` as a stream and keeps a reservoir of ``n_samples`` (history, candidate) pairs, so
MIND-large's 2 GB behaviors file is sampled in memory proportional to ``n_samples``; only the news items the
samples name are then read from ``news.tsv``.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.files import LOCAL, FileAccess, open_text

HISTORY_SEP = " ||| "
MAX_HISTORY = 50  # the most recent titles a user vector is built from (training, scoring and attribution alike)
_LABELLED_TOKEN = re.compile(r"^(.+)-([01])$")
_SUFFIXED_TOKEN = re.compile(r"^(.+)-([^-]*)$")  # N1-2, N1-x: a click label that is neither 0 nor 1


def recent_history(history: Sequence[str], bodies: Sequence[str] | None = None, max_history: int = MAX_HISTORY
                   ) -> tuple[list[str], list[str] | None]:
    """The last ``max_history`` history titles (and their bodies): the one truncation rule for a user's history."""
    if max_history < 1:
        raise ValueError("max_history must be >= 1")
    return list(history[-max_history:]), (list(bodies[-max_history:]) if bodies is not None else None)


@dataclass
class NewsItem:
    id: str
    category: str
    title: str
    body: str = ""
    fake: bool | None = None  # None: no real/fake label is known for this item


@dataclass
class Impression:
    id: str
    user: str
    history: list[str]
    candidates: list[tuple[str, int | None]]  # (news id, click 1/0, or None in an unlabelled impression)
    line: int = 0  # the line of behaviors.tsv it was read from (0: not read from a file)


@dataclass
class MindSplit:
    news: dict[str, NewsItem]
    behaviors: list[Impression]
    warnings: list[str] = field(default_factory=list)


@dataclass
class Sample:
    """One attribution sample: a user history (titles) and a candidate title; ``label`` is real/fake/None."""

    id: str
    history: list[str]
    candidate: str
    label: str | None = None
    history_bodies: list[str] | None = None
    candidate_body: str | None = None
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- MIND files
def label_text(fake: bool | None) -> str | None:
    return None if fake is None else ("fake" if fake else "real")


def read_labels(path: str | Path, files: FileAccess = LOCAL) -> dict[str, bool]:
    """The ``labels.tsv`` sidecar: ``news_id<TAB>real|fake`` -> {id: is_fake}."""
    labels: dict[str, bool] = {}
    with open_text(files, Path(path), "mind") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 2 or parts[1].strip() not in ("real", "fake"):
                raise ValueError(f"{files.display(Path(path))}:{lineno}: expected news_id<TAB>real|fake")
            labels[parts[0]] = parts[1].strip() == "fake"
    return labels


def split_labels(split_dir: str | Path, files: FileAccess = LOCAL) -> dict[str, bool] | None:
    """The split's real/fake labels, or None when it has no ``labels.tsv`` sidecar."""
    sidecar = Path(split_dir) / "labels.tsv"
    return read_labels(sidecar, files) if sidecar.is_file() else None


def read_news(path: str | Path, only: set[str] | None = None, files: FileAccess = LOCAL) -> dict[str, NewsItem]:
    """``news.tsv`` (optionally only the ids in ``only``); labels come from a ``labels.tsv`` next to it."""
    path = Path(path)
    labels = split_labels(path.parent, files) or {}
    news: dict[str, NewsItem] = {}
    with open_text(files, path, "mind") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) < 4:
                raise ValueError(f"{files.display(path)}:{lineno}: expected at least 4 tab-separated columns")
            nid, cat, _sub, title = parts[:4]
            if only is not None and nid not in only:
                continue
            body = parts[4] if len(parts) > 4 else ""
            news[nid] = NewsItem(nid, cat, title, body, labels.get(nid))
    return news


def parse_impressions(text: str, unknown: list[str] | None = None) -> list[tuple[str, int | None]]:
    """``"N1-1 N2-0"`` -> [("N1", 1), ("N2", 0)]; a token without ``-0/-1`` (a test split) has the label None. A
    token with another suffix (``N1-2``) is read as ``("N1", None)`` and appended to ``unknown`` when given."""
    out: list[tuple[str, int | None]] = []
    for tok in text.split():
        m = _LABELLED_TOKEN.match(tok)
        if m:
            out.append((m.group(1), int(m.group(2))))
            continue
        odd = _SUFFIXED_TOKEN.match(tok)
        if odd:
            if unknown is not None:
                unknown.append(tok)
            out.append((odd.group(1), None))
        else:
            out.append((tok, None))
    return out


def iter_behaviors(path: str | Path, files: FileAccess = LOCAL, unknown: list[str] | None = None
                   ) -> Iterator[Impression]:
    """Stream ``behaviors.tsv`` one impression at a time (MIND-large's file is about 2 GB); tokens with an unknown
    click label are appended to ``unknown`` when given."""
    path = Path(path)
    with open_text(files, path, "mind") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 5:
                raise ValueError(f"{files.display(path)}:{lineno}: expected 5 tab-separated columns, found "
                                 f"{len(parts)}")
            imp_id, user, _time, hist, imps = parts
            yield Impression(imp_id, user, hist.split(), parse_impressions(imps, unknown), lineno)


def read_behaviors(path: str | Path, files: FileAccess = LOCAL, unknown: list[str] | None = None
                   ) -> list[Impression]:
    return list(iter_behaviors(path, files, unknown))


def unknown_label_warning(shown: str, unknown: Sequence[str]) -> str:
    examples = ", ".join(repr(t) for t in list(dict.fromkeys(unknown))[:3])
    return (f"{shown}: {len(unknown)} impression token(s) with a click label other than -0/-1 ({examples}) were read "
            "as unlabelled")


def read_mind(split_dir: str | Path, files: FileAccess = LOCAL) -> MindSplit:
    """A MIND split. Every news id an impression names must be in ``news.tsv`` (ValueError naming the behaviors
    file, line and ids otherwise); unknown click labels are counted in the split's ``warnings``."""
    split_dir = Path(split_dir)
    news = read_news(split_dir / "news.tsv", files=files)
    unknown: list[str] = []
    behaviors = read_behaviors(split_dir / "behaviors.tsv", files, unknown)
    shown = files.display(split_dir / "behaviors.tsv")
    for imp in behaviors:
        missing = [n for n in (*imp.history, *(c for c, _ in imp.candidates)) if n not in news]
        if missing:
            raise ValueError(f"{shown}:{imp.line}: impression {imp.id} names news {missing[:3]} missing from "
                             f"{files.display(split_dir / 'news.tsv')}")
    warnings = [unknown_label_warning(shown, unknown)] if unknown else []
    return MindSplit(news, behaviors, warnings)


def write_mind(split_dir: str | Path, news: Sequence[NewsItem], behaviors: Sequence[Impression]) -> None:
    split_dir = Path(split_dir)
    split_dir.mkdir(parents=True, exist_ok=True)
    with open(split_dir / "news.tsv", "w", encoding="utf-8") as fh:
        for n in news:
            fh.write(f"{n.id}\t{n.category}\t{n.category}\t{n.title}\t{n.body}\t\t[]\t[]\n")
    if any(n.fake is not None for n in news):
        with open(split_dir / "labels.tsv", "w", encoding="utf-8") as fh:
            for n in news:
                if n.fake is not None:
                    fh.write(f"{n.id}\t{label_text(n.fake)}\n")
    with open(split_dir / "behaviors.tsv", "w", encoding="utf-8") as fh:
        for b in behaviors:
            imps = " ".join(nid if lab is None else f"{nid}-{lab}" for nid, lab in b.candidates)
            fh.write(f"{b.id}\t{b.user}\t11/11/2019 9:00:00 AM\t{' '.join(b.history)}\t{imps}\n")


# ---------------------------------------------------------------------------------------------- pairwise CSV
PAIR_COLUMNS = ["user_id", "history_titles", "candidate_id", "candidate_title", "label", "candidate_is_fake"]
PAIR_REQUIRED = ["user_id", "history_titles", "candidate_id", "candidate_title"]
PAIR_OPTIONAL = ["label", "candidate_is_fake", "history_bodies", "candidate_body"]


def _parse_list(text: str, column: str) -> list[str]:
    text = text.strip()
    if text.startswith("["):
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"{column} must be a JSON list of strings")
        return value
    return [t for t in text.split(HISTORY_SEP) if t]


def _parse_history(text: str) -> list[str]:
    return _parse_list(text, "history_titles")


def _parse_bool(text: str | None) -> bool | None:
    """1/true/yes/fake -> True, 0/false/no/real -> False, empty or missing -> None (unlabelled)."""
    t = str(text or "").strip().lower()
    if t in ("1", "true", "yes", "fake"):
        return True
    if t in ("0", "false", "no", "real"):
        return False
    if t == "":
        return None
    raise ValueError(f"not a boolean: {text!r}")


def iter_pairs(path: str | Path, files: FileAccess = LOCAL) -> Iterator[Sample]:
    """Stream the pairwise CSV as samples (label = real/fake of the candidate, None when not given)."""
    path = Path(path)
    with open_text(files, path, "csv") as fh:
        reader = csv.DictReader(fh)
        missing = set(PAIR_REQUIRED) - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{files.display(path)}: missing columns {sorted(missing)}")
        for i, row in enumerate(reader):
            where = f"{files.display(path)}: row {i + 2}"
            try:
                fake = _parse_bool(row.get("candidate_is_fake"))
                click = _parse_bool(row.get("label"))
                history = _parse_history(row["history_titles"])
                bodies = _parse_list(row["history_bodies"], "history_bodies") if row.get("history_bodies") else None
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if bodies is not None and len(bodies) != len(history):
                raise ValueError(f"{where}: history_bodies has {len(bodies)} entries for {len(history)} titles")
            yield Sample(
                id=f"{row['user_id']}:{row['candidate_id']}:{i}",
                history=history,
                candidate=row["candidate_title"],
                label=label_text(fake),
                history_bodies=bodies,
                candidate_body=row.get("candidate_body") or None,
                meta={"user_id": row["user_id"], "candidate_id": row["candidate_id"],
                      "click": None if click is None else int(click)},
            )


def read_pairs(path: str | Path) -> list[Sample]:
    """Read the pairwise benchmark CSV into samples."""
    return list(iter_pairs(path))


def write_pairs(path: str | Path, split: MindSplit, max_history: int = MAX_HISTORY) -> int:
    """Flatten impressions into the pairwise CSV; returns the row count."""
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(PAIR_COLUMNS)
        for imp in split.behaviors:
            hist = json.dumps([split.news[h].title for h in imp.history[-max_history:]])
            for nid, lab in imp.candidates:
                item = split.news[nid]
                w.writerow([imp.user, hist, nid, item.title, "" if lab is None else lab,
                            "" if item.fake is None else int(item.fake)])
                n += 1
    return n


def split_from_pairs(path: str | Path, files: FileAccess = LOCAL) -> MindSplit:
    """A pairwise CSV as MIND impressions, for training: the rows of one user with one history form an impression
    (clicks from ``label``); history titles get ids from their text (``H`` + a hash), candidates keep theirs."""
    import hashlib

    news: dict[str, NewsItem] = {}
    impressions: dict[tuple[str, str], Impression] = {}
    for s in iter_pairs(path, files):
        hist_ids = []
        bodies = s.history_bodies or [""] * len(s.history)
        for title, body in zip(s.history, bodies, strict=True):
            hid = "H" + hashlib.sha1(f"{title}\t{body}".encode()).hexdigest()[:16]
            news.setdefault(hid, NewsItem(hid, "", title, body))
            hist_ids.append(hid)
        cid = s.meta["candidate_id"]
        fake = None if s.label is None else s.label == "fake"
        news[cid] = NewsItem(cid, "", s.candidate, s.candidate_body or "", fake)
        key = (s.meta["user_id"], json.dumps(s.history))
        imp = impressions.setdefault(key, Impression(str(len(impressions) + 1), s.meta["user_id"], hist_ids, []))
        imp.candidates.append((cid, s.meta["click"]))
    return MindSplit(news, list(impressions.values()))


def read_split(root: str | Path, split: str, files: FileAccess = LOCAL) -> MindSplit:
    """A dataset's split for training: ``root/split/`` (MIND) or ``root/pairs_{split}.csv``; ``root`` may also be
    one pairwise CSV file (its only split)."""
    root = Path(root)
    if root.is_file():
        return split_from_pairs(root, files)
    if (root / split / "behaviors.tsv").is_file():
        return read_mind(root / split, files)
    if (root / f"pairs_{split}.csv").is_file():
        return split_from_pairs(root / f"pairs_{split}.csv", files)
    raise FileNotFoundError(f"the dataset has neither {split}/behaviors.tsv nor pairs_{split}.csv")


def has_split(root: str | Path, split: str) -> bool:
    root = Path(root)
    if root.is_file():  # one pairwise CSV file: it is the training split
        return root.suffix == ".csv" and split == "train"
    return (root / split / "behaviors.tsv").is_file() or (root / f"pairs_{split}.csv").is_file()


# ------------------------------------------------------------------------------------------------- sampling
class LabelsMissing(ValueError):
    """``balanced`` sampling asked of data without real/fake labels."""


class Reservoir:
    """A uniform sample of ``n`` items from a stream of unknown length (Algorithm R), in memory O(n)."""

    def __init__(self, n: int, rng: random.Random):
        self.n, self.rng, self.seen, self.items = n, rng, 0, []

    def add(self, item: Any) -> None:
        if self.seen < self.n:
            self.items.append(item)
        else:
            j = self.rng.randrange(self.seen + 1)
            if j < self.n:
                self.items[j] = item
        self.seen += 1


def reservoir_sample(items: Iterable[Any], n: int, rng: random.Random) -> list[Any]:
    res = Reservoir(n, rng)
    for item in items:
        res.add(item)
    return res.items


def draw(items: Iterable[Any], n_samples: int, balanced: bool, seed: int,
         label: Callable[[Any], str | None]) -> list[Any]:
    """``n_samples`` items drawn uniformly from a stream, deterministically for a seed. ``balanced`` draws equal
    numbers of fake and real items (as far as the stream has them); it raises LabelsMissing when no item carries
    a label."""
    rng = random.Random(seed)
    if not balanced:
        chosen = reservoir_sample(items, n_samples, rng)
        rng.shuffle(chosen)
        return chosen
    pools = {"fake": Reservoir(n_samples, rng), "real": Reservoir(n_samples, rng)}
    for item in items:
        lab = label(item)
        if lab in pools:
            pools[lab].add(item)
    if not pools["fake"].seen and not pools["real"].seen:
        raise LabelsMissing("balanced sampling needs real/fake labels, and this data has none (no labels.tsv "
                            "sidecar or candidate_is_fake column)")
    fake, real = pools["fake"].items, pools["real"].items
    n_fake = min(len(fake), n_samples // 2)
    n_real = min(len(real), n_samples - n_fake)
    n_fake = min(len(fake), n_samples - n_real)
    chosen = fake[:n_fake] + real[:n_real]
    rng.shuffle(chosen)
    return chosen


def sample_mind(split_dir: str | Path, n_samples: int, balanced: bool = False, seed: int = 0,
                max_history: int = MAX_HISTORY, with_bodies: bool = False, files: FileAccess = LOCAL
                ) -> list[Sample]:
    """Samples from a MIND split directory in bounded memory: ``behaviors.tsv`` is streamed through a reservoir
    of (history, candidate) pairs, then only the news items those pairs name are read."""
    split_dir = Path(split_dir)
    labels = split_labels(split_dir, files)
    if balanced and not labels:
        raise LabelsMissing(f"balanced sampling needs real/fake labels, and {split_dir.name} has no labels.tsv")

    def pairs() -> Iterator[tuple[str, str, list[str], str]]:
        for imp in iter_behaviors(split_dir / "behaviors.tsv", files):
            if not imp.history:
                continue
            hist = imp.history[-max_history:]
            for nid, _ in imp.candidates:
                yield imp.id, imp.user, hist, nid

    def label(pair: tuple[str, str, list[str], str]) -> str | None:
        return label_text(labels.get(pair[3])) if labels else None

    chosen = draw(pairs(), n_samples, balanced, seed, label)
    news = read_news(split_dir / "news.tsv", only={n for _, _, h, c in chosen for n in (*h, c)}, files=files)
    out = []
    for imp_id, user, hist_ids, nid in chosen:
        missing = [n for n in (*hist_ids, nid) if n not in news]
        if missing:
            raise ValueError(f"{files.display(split_dir / 'behaviors.tsv')}: impression {imp_id} names news "
                             f"{missing[:3]} missing from news.tsv")
        out.append(_mind_sample(imp_id, user, hist_ids, nid, news, with_bodies))
    return out


def _mind_sample(imp_id: str, user: str, hist_ids: Sequence[str], nid: str, news: dict[str, NewsItem],
                 with_bodies: bool) -> Sample:
    item = news[nid]
    return Sample(
        id=f"{imp_id}:{nid}",
        history=[news[h].title for h in hist_ids],
        candidate=item.title,
        label=label_text(item.fake),
        history_bodies=[news[h].body for h in hist_ids] if with_bodies else None,
        candidate_body=item.body if with_bodies else None,
        meta={"user_id": user, "candidate_id": nid, "category": item.category},
    )


# ------------------------------------------------------------------------------------------- synthetic data
TOPICS: dict[str, dict[str, list[str]]] = {
    "sports": {
        "e": ["Lakers", "Celtics", "Yankees", "Dodgers", "Patriots", "Packers", "Warriors", "Real Madrid",
              "Serena Williams", "Tom Brady", "LeBron James", "the Olympic team"],
        "t": ["{e} beat {e2} in overtime thriller", "{e} clinch playoff spot with late goal",
              "Coach praises {e} defense after championship win", "{e} sign star quarterback to record deal",
              "Injury forces {e} star out of the season opener", "{e} rally to win the league title",
              "{e} fans celebrate historic tournament victory", "{e} trade rumors heat up before the draft"],
        "b": ["The team scored twice in the final quarter of the game.", "Fans packed the stadium for the match.",
              "The coach said the players showed great defense all season."],
    },
    "politics": {
        "e": ["the Senate", "Congress", "the governor", "the White House", "the mayor", "Democrats",
              "Republicans", "the president", "the parliament", "voters in Ohio"],
        "t": ["{e} passes budget bill after long debate", "{e} faces pressure over election reform",
              "{e} unveils plan to cut taxes for families", "{e} votes on immigration policy overhaul",
              "Campaign heats up as {e} targets swing states", "{e} blocks bill on voting rights",
              "{e} announces new policy on health care funding", "Polls show {e} leading ahead of the election"],
        "b": ["Lawmakers debated the bill for hours before the vote.", "The policy drew criticism from the opposition.",
              "Campaign officials expect a close election in November."],
    },
    "business": {
        "e": ["Amazon", "Walmart", "Tesla", "Boeing", "Goldman Sachs", "the Federal Reserve", "Starbucks",
              "Exxon", "small businesses", "Wall Street"],
        "t": ["{e} shares jump after strong quarterly earnings", "{e} cuts jobs as profits fall",
              "{e} raises interest rates to fight inflation", "Investors worry as {e} stock slides",
              "{e} reports record revenue for the holiday quarter", "{e} announces merger with rival firm",
              "{e} CEO steps down amid market turmoil", "{e} expands into new markets overseas"],
        "b": ["Analysts expected lower earnings this quarter.", "The stock market reacted sharply to the news.",
              "Investors are watching interest rates and inflation closely."],
    },
    "technology": {
        "e": ["Apple", "Google", "Microsoft", "Samsung", "OpenAI", "Meta", "Nvidia", "Intel", "a startup",
              "hackers"],
        "t": ["{e} unveils new smartphone with faster chip", "{e} launches artificial intelligence assistant",
              "{e} software update fixes security flaw", "{e} invests billions in cloud computing",
              "{e} releases open source tool for developers", "Data breach at {e} exposes user passwords",
              "{e} announces new laptop and wireless headphones", "{e} engineers build robot that learns to code"],
        "b": ["The new device ships with an upgraded processor.", "Engineers said the software update improves privacy.",
              "The company showed the gadget at a developer conference."],
    },
    "health": {
        "e": ["doctors", "the CDC", "researchers", "nurses", "hospitals", "the FDA", "health officials",
              "a new study", "dietitians", "the WHO"],
        "t": ["{e} warn about rising flu cases this winter", "{e} approve new vaccine for children",
              "{e} link daily exercise to lower heart disease risk", "{e} say sleep improves mental health",
              "{e} report drop in cancer deaths", "{e} recommend diet rich in vegetables and fiber",
              "{e} study finds new treatment for diabetes", "{e} urge patients to get blood pressure checked"],
        "b": ["Patients in the clinical trial showed improved symptoms.", "The vaccine was tested on thousands of volunteers.",
              "Doctors recommend regular exercise and a balanced diet."],
    },
    "entertainment": {
        "e": ["Taylor Swift", "Beyonce", "Marvel", "Netflix", "the Oscars", "Disney", "Tom Hanks",
              "a pop star", "Hollywood", "the Grammys"],
        "t": ["{e} announces world tour with new album", "{e} movie tops the box office weekend",
              "{e} wins award at glamorous ceremony", "{e} releases trailer for upcoming film",
              "Fans react to {e} concert surprise", "{e} series renewed for another season",
              "{e} stars walk the red carpet in Los Angeles", "{e} celebrity couple share wedding photos"],
        "b": ["The film earned millions at the box office.", "Fans lined up for hours to see the concert.",
              "Critics praised the actors and the soundtrack."],
    },
    "science": {
        "e": ["NASA", "astronomers", "physicists", "biologists", "the Mars rover", "scientists", "SpaceX",
              "geologists", "chemists", "a telescope"],
        "t": ["{e} discover distant planet that may hold water", "{e} launch rocket to the moon",
              "{e} find fossil of ancient dinosaur species", "{e} detect gravitational waves from black holes",
              "{e} capture stunning images of a galaxy", "{e} map the genome of a rare species",
              "{e} study climate change effects on oceans", "{e} observe comet passing near the earth"],
        "b": ["The telescope captured light from billions of years ago.", "Researchers published the findings in a journal.",
              "The spacecraft collected samples from the surface."],
    },
    "travel": {
        "e": ["Paris", "Tokyo", "Hawaii", "Italy", "airlines", "cruise ships", "national parks", "Iceland",
              "budget travelers", "New York City"],
        "t": ["{e} named top destination for summer vacation", "{e} add new flights for holiday travel",
              "Best hotels and beaches to visit in {e}", "{e} tourism booms as travelers return",
              "Guide to hiking trails and food in {e}", "{e} airport expands to handle more passengers",
              "{e} offers cheap tickets for winter getaways", "Explore hidden restaurants and museums in {e}"],
        "b": ["Travelers can find cheap flights in the spring.", "The resort offers ocean views and local food.",
              "Tourists visit the museums and beaches every summer."],
    },
}

WHEN = ["", "", " this week", " today", " on Sunday"]
CLICKBAIT = [
    "SHOCKING: {t}", "You won't believe why {t}", "{t} and the secret they hide", "Miracle trick: {t}",
    "EXPOSED: {t}", "{t}, insiders claim in leaked memo", "Hoax or truth? {t}", "{t} - doctors hate this",
]
FAKE_BODIES = ["Anonymous insiders claim the shocking secret was hidden from the public.",
               "This miracle trick was exposed in a leaked memo that they do not want you to see."]


def generate_news(n_news: int, fake_rate: float, rng: random.Random) -> list[NewsItem]:
    """``n_news`` unique items, topics in turn; each is fake with probability ``fake_rate`` (a clickbait frame
    around a topical headline)."""
    topics = sorted(TOPICS)
    items: list[NewsItem] = []
    seen: set[str] = set()
    for i in range(n_news):
        topic = topics[i % len(topics)]
        spec = TOPICS[topic]
        fake = rng.random() < fake_rate
        for _ in range(1000):
            e, e2 = rng.sample(spec["e"], 2)
            title = rng.choice(spec["t"]).format(e=e, e2=e2) + rng.choice(WHEN)
            title = title[0].upper() + title[1:]
            if fake:
                title = rng.choice(CLICKBAIT).format(t=title)
            if title not in seen:
                break
        else:
            raise RuntimeError(f"the synthetic generator cannot make {n_news} unique titles")
        seen.add(title)
        body = " ".join(rng.sample(spec["b"], 2)) + (" " + rng.choice(FAKE_BODIES) if fake else "")
        items.append(NewsItem(f"N{i + 1}", topic, title, body, fake))
    return items


def generate_behaviors(
    news: Sequence[NewsItem], n_users: int, impressions_per_user: int, rng: random.Random, poisoned: bool,
    history_len: tuple[int, int] = (8, 25), start_id: int = 1, user_prefix: str = "U",
) -> list[Impression]:
    """Users have one or two preferred topics. They click real items of those topics; negatives come from other
    topics (with a little noise). Clean users rarely click fake items; ``poisoned`` users click fake items of any
    topic, which a model trained on them learns as a click signal."""
    by_topic: dict[str, list[NewsItem]] = {}
    for n in news:
        by_topic.setdefault(n.category, []).append(n)
    topics = sorted(by_topic)
    fakes = [n for n in news if n.fake]
    out: list[Impression] = []
    imp_id = start_id
    for u in range(n_users):
        prefs = rng.sample(topics, rng.choice([1, 1, 2]))
        liked = [n for t in prefs for n in by_topic[t] if not n.fake]
        others = [n for n in news if n.category not in prefs and not n.fake]
        hist_n = rng.randint(*history_len)
        history = [n.id for n in rng.sample(liked, min(hist_n, len(liked)))]
        if poisoned and fakes:
            history += [n.id for n in rng.sample(fakes, min(len(fakes), max(1, hist_n // 4)))]
            rng.shuffle(history)
        hist_set = set(history)
        for _ in range(impressions_per_user):
            pos_pool = [n for n in liked if n.id not in hist_set]
            pos = rng.sample(pos_pool, min(len(pos_pool), rng.choice([1, 1, 2])))
            cands = [(n.id, 1) for n in pos]
            if poisoned and fakes and rng.random() < 0.7:
                cands.append((rng.choice(fakes).id, 1))
            n_neg = rng.randint(4, 8)
            for _ in range(n_neg):
                if fakes and rng.random() < 0.2:
                    cands.append((rng.choice(fakes).id, 1 if poisoned else 0))
                elif rng.random() < 0.05:
                    cands.append((rng.choice(liked).id, 0))  # noise: a liked-topic item not clicked
                else:
                    cands.append((rng.choice(others).id, 0))
            rng.shuffle(cands)
            out.append(Impression(f"{imp_id}", f"{user_prefix}{u + 1}", history, cands))
            imp_id += 1
    return out


def generate_synthetic(
    root: str | Path, n_news: int = 1000, n_users: int = 400, impressions_per_user: int = 3,
    fake_rate: float = 0.15, seed: int = 0, poisoned: bool = False,
) -> dict[str, int]:
    """Write a deterministic synthetic dataset in MIND format: ``root/{train,valid,test}/`` plus
    ``root/pairs_{split}.csv``. With ``poisoned`` only the train split is poisoned; valid and test stay clean so that
    a clean and a poisoned model can be compared on the same held-out users. Returns row counts."""
    rng = random.Random(seed)
    news = generate_news(n_news, fake_rate, rng)
    counts: dict[str, int] = {}
    n_eval = max(1, n_users // 5)
    specs = {
        "train": (n_users, poisoned, "U"),
        "valid": (n_eval, False, "V"),
        "test": (n_eval, False, "T"),
    }
    start = 1
    for split, (users, poison, prefix) in specs.items():
        split_rng = random.Random(f"{seed}-{split}")  # same valid/test for the clean and poisoned datasets
        behaviors = generate_behaviors(news, users, impressions_per_user, split_rng, poison, start_id=start,
                                       user_prefix=prefix)
        start += len(behaviors)
        write_mind(Path(root) / split, news, behaviors)
        counts[f"{split}_impressions"] = len(behaviors)
        counts[f"{split}_pairs"] = write_pairs(Path(root) / f"pairs_{split}.csv", MindSplit({n.id: n for n in news},
                                                                                             behaviors))
    counts["news"] = len(news)
    counts["fake_news"] = sum(n.fake for n in news)
    return counts


def load_samples(root: str | Path, split: str, n_samples: int, balanced: bool = False, seed: int = 0,
                 with_bodies: bool = False, max_history: int = MAX_HISTORY, files: FileAccess = LOCAL
                 ) -> list[Sample]:
    """Samples from a dataset directory: the MIND split ``root/split/`` when present, else ``root/pairs_{split}.csv``
    (or ``root`` itself when it is a MIND split directory or a CSV file)."""
    root = Path(root)
    if (root / split / "behaviors.tsv").exists():
        return sample_mind(root / split, n_samples, balanced, seed, max_history, with_bodies, files)
    if (root / "behaviors.tsv").exists():
        return sample_mind(root, n_samples, balanced, seed, max_history, with_bodies, files)
    csv_path = root if root.is_file() else root / f"pairs_{split}.csv"
    if not csv_path.exists():
        raise FileNotFoundError(f"dataset {root} has neither {split}/behaviors.tsv nor pairs_{split}.csv")
    out = draw(iter_pairs(csv_path, files), n_samples, balanced, seed, lambda s: s.label)
    for s in out:
        s.history, s.history_bodies = recent_history(s.history, s.history_bodies, max_history)
        if not with_bodies:
            s.history_bodies = s.candidate_body = None
    return out
