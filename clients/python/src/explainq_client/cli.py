"""``explainq-client``: submit and follow explainq jobs from a shell.

Exit codes: 0 success; 1 the job failed; 2 bad usage or a request the server refused (422); 3 the job was
canceled; 4 any other API or connection error (401, 404, 409, 413, 429, 503...); 5 ``--timeout`` passed (the job
keeps running on the server); 141 stdout was closed early (``explainq-client result <id> | head``), as a command
killed by SIGPIPE reports it; nothing is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from explainq_client._kinds import kind_name
from explainq_client.client import Client, Job
from explainq_client.errors import (
    APIConnectionError,
    APIError,
    ExplainqError,
    JobCanceledError,
    JobFailedError,
    ValidationError,
    WaitTimeoutError,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELED, EXIT_API, EXIT_TIMEOUT = 0, 1, 2, 3, 4, 5
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away


class ProgressBar:
    """A one-line progress bar on a terminal; one line per change otherwise (logs stay readable)."""

    def __init__(self, out: TextIO, width: int = 30):
        self.out = out
        self.width = width
        self.tty = out.isatty()
        self.last = ""

    def update(self, job: Job) -> None:
        p = job.progress or {}
        done, total = p.get("done"), p.get("total")
        if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
            filled = int(self.width * min(done / total, 1.0))
            bar = f"[{'#' * filled}{'.' * (self.width - filled)}] {done:g}/{total:g} {p.get('unit') or ''}"
        elif done is not None:
            bar = f"{done:g} {p.get('unit') or ''}"
        else:
            bar = ""
        eta = f" eta {p['eta_s']:.0f}s" if p.get("eta_s") is not None and not job.done else ""
        message = f"  {p['message']}" if p.get("message") else ""
        if job.status == "queued" and job.waiting_reason:
            message = f"  {job.waiting_reason}"
        where = f" (position {job.position} in {job.queue})" if job.status == "queued" and job.position is not None \
            else ""
        line = f"{job.status:<9}{where} {bar}{eta}{message}".rstrip()
        if line == self.last:
            return
        self.last = line
        if self.tty:
            self.out.write("\r\033[K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.out.write("\n")
            self.out.flush()


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str("" if v is None else v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _read_request(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError(f"{path} must hold a JSON object (the request body)")
    return body


class UsageError(Exception):
    pass


# ------------------------------------------------------------------------------------------------ commands
def _finish(job: Job, args: argparse.Namespace) -> int:
    """Wait (quietly, or with a progress bar when following); print the final job; raise when it ended badly."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    if args.follow:
        bar = ProgressBar(sys.stderr)
        bar.update(job)
        try:
            for event in job.stream():
                if event.job is not None:
                    bar.update(job)
                if deadline is not None and time.monotonic() > deadline and not job.done:
                    raise WaitTimeoutError(job, args.timeout)
        finally:
            bar.close()
    try:
        job.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 0.0))
    except WaitTimeoutError:
        raise WaitTimeoutError(job, args.timeout) from None  # report the timeout as given
    _print_json(job.data)
    return EXIT_OK


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    body = _read_request(args.request)
    try:
        given = {"label": args.label} if args.label is not None else {}
        if args.tag:
            given["tags"] = args.tag
        job = client.submit(args.kind, body, idempotency_key=args.idempotency_key, **given)
    except ValueError as exc:  # a kind the server does not run
        raise UsageError(str(exc)) from None
    if not (args.wait or args.follow):
        _print_json(job.data)
        return EXIT_OK
    print(f"submitted {job.kind} job {job.id}", file=sys.stderr)
    return _finish(job, args)


def _known_kind(client: Client, kind: str) -> str:
    """``kind`` as the server names it (``train-bdh`` and ``train/bdh`` are ``train_bdh``); a kind the server
    does not run is a usage error naming those it does."""
    try:
        return kind_name(kind, client._kind_table())
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    kind = None if args.kind is None else _known_kind(client, args.kind)
    page = client.jobs.list(kind=kind, status=args.status, limit=args.limit, cursor=args.cursor, q=args.search,
                            tag=args.tag or None)
    if args.json:
        _print_json({"items": [j.data for j in page], "next_cursor": page.next_cursor})
        return EXIT_OK
    rows = []
    for job in page:
        p = job.progress or {}
        progress = f"{p.get('done'):g}/{p.get('total'):g} {p.get('unit') or ''}" \
            if isinstance(p.get("done"), int | float) and isinstance(p.get("total"), int | float) else ""
        code = (job.error or {}).get("code", "")
        rows.append([job.id, job.kind, job.status, progress, code, job.created_at, job.model, job.label,
                     ",".join(job.tags)])
    _table(["id", "kind", "status", "progress", "error", "created_at", "model", "label", "tags"], rows)
    if page.next_cursor:
        print(f"more: --cursor {page.next_cursor}", file=sys.stderr)
    return EXIT_OK


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.jobs.get(args.id)
    if args.wait or args.follow:
        return _finish(job, args)
    _print_json(job.data)
    return EXIT_OK


def cmd_result(client: Client, args: argparse.Namespace) -> int:
    result = client.jobs.get(args.id).result()
    if args.table:
        if not result.validated:
            print("note: this result was written by an earlier version of the server and does not match its "
                  "kind's result schema; it is printed as JSON", file=sys.stderr)
        sys.stdout.write(result.text() + "\n")
    else:
        _print_json(dict(result))
    return EXIT_OK


def cmd_entries(client: Client, args: argparse.Namespace) -> int:
    """Every entry of a listed list, one JSON object per line (JSON Lines), streamed from its artifact."""
    for entry in client.jobs.get(args.id).entries(args.name):
        sys.stdout.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return EXIT_OK


def cmd_export(client: Client, args: argparse.Namespace) -> int:
    """A CSV, TSV or JSONL artifact in full, written as Parquet, CSV or JSONL (pandas; pyarrow for Parquet)."""
    print(client.jobs.get(args.id).export(args.name, args.dest, args.format))
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    _print_json(client.jobs.cancel(args.id).data)
    return EXIT_OK


def cmd_keep(client: Client, args: argparse.Namespace) -> int:
    job = client.jobs.get(args.id)
    _print_json((job.unkeep() if args.undo else job.keep()).data)
    return EXIT_OK


def cmd_delete(client: Client, args: argparse.Namespace) -> int:
    _print_json(client.delete_job(args.id))
    return EXIT_OK


def cmd_artifacts(client: Client, args: argparse.Namespace) -> int:
    job = client.jobs.get(args.id)
    if args.download:
        for path in job.download(args.download, names=args.name or None):
            print(path)
        return EXIT_OK
    _table(["name", "size", "media_type", "url"], [[a.name, a.size, a.media_type, a.url] for a in job.artifacts()])
    return EXIT_OK


def cmd_models(client: Client, args: argparse.Namespace) -> int:
    listing = client.models.list()
    if args.json:
        _print_json({"models": [m.__dict__ for m in listing.models],
                     "datasets": [d.__dict__ for d in listing.datasets]})
        return EXIT_OK
    _table(["model", "kind", "owner", "parameters", "devices", "loaded on", "status"],
           [[m.name, m.kind, m.owner, m.parameters, ",".join(m.devices),
             ",".join(str(w.get("worker")) for w in m.loaded_on), m.status] for m in listing.models])
    if listing.datasets:
        print()
        _table(["dataset", "kind", "owner"], [[d.name, d.kind, d.owner] for d in listing.datasets])
    return EXIT_OK


def cmd_kinds(client: Client, args: argparse.Namespace) -> int:
    kinds = client.kinds()
    if args.json:
        _print_json({"kinds": kinds})
        return EXIT_OK
    for k in kinds:
        print(f"{k['name']:<14} POST {k['route']:<16} {k['queue']:<8} {k.get('summary', '')}")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------ parser
def _add_wait_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="wait for the job to end; exit code says how")
    parser.add_argument("--follow", action="store_true", help="like --wait, with a progress bar on stderr")
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up waiting after this many seconds (with --follow: checked at each event, "
                        "which the server sends at least every 15 s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="explainq-client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="the server (default: $EXPLAINQ_URL or http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=None, help="the API key (default: $EXPLAINQ_API_KEY)")
    parser.add_argument("--max-retries", type=int, default=None, help="retries on 429, 503 and lost connections")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("submit", help="submit a job from a JSON request file ('-' for stdin)")
    p.add_argument("kind", help="a job kind the server runs (see `kinds`), or a route such as /train/bdh")
    p.add_argument("request", help="the request body as a JSON file, or - for stdin")
    p.add_argument("--idempotency-key", default=None, help="default: a fresh random key")
    p.add_argument("--label", default=None, help="a label for the job (over the request file's)")
    p.add_argument("--tag", action="append", default=None,
                   help="a tag for the job (repeatable; over the request file's tags)")
    _add_wait_flags(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="list your jobs, newest first")
    p.add_argument("--kind", default=None, help="only jobs of this kind (one the server runs, see `kinds`)")
    p.add_argument("--status", default=None, choices=("queued", "running", "succeeded", "failed", "canceled"))
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--cursor", default=None, help="the next page's cursor")
    p.add_argument("--search", "-q", default=None, metavar="TEXT",
                   help="only jobs whose label, model, input, kind or id holds TEXT (any case)")
    p.add_argument("--tag", action="append", default=None, help="only jobs with this tag (repeatable: all of them)")
    p.add_argument("--json", action="store_true", help="print the JSON page")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("status", help="a job's status and progress (JSON)")
    p.add_argument("id")
    _add_wait_flags(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("result", help="a succeeded job's result (JSON, or --table)")
    p.add_argument("id")
    p.add_argument("--table", action="store_true", help="plain-text tables: attributions (each sample's top "
                   "words), influence (each test triple's proponents and opponents), training (one row per "
                   "epoch, then the result's values), ablation (the representation table), the ConvE and classifier "
                   "evaluations (each estimator's numbers); JSON for other kinds and for a result of an earlier "
                   "version")
    p.set_defaults(func=cmd_result)

    p = sub.add_parser("entries", help="every entry of a result's list, one JSON per line, however many the result "
                       "holds inline (e.g. an influence query's results, an attribution run's samples)")
    p.add_argument("id")
    p.add_argument("name", help="the list: a key of the result's `listed` (results, ranking, samples, errors, "
                   "comparison.samples...) or any list the result holds whole")
    p.set_defaults(func=cmd_entries)

    p = sub.add_parser("export", help="write a CSV, TSV or JSONL artifact in full (a ranking: influence.csv, "
                       "self_influence.jsonl, suspects.csv...) as Parquet, CSV or JSONL (needs pandas; pyarrow for "
                       "Parquet)")
    p.add_argument("id")
    p.add_argument("name", help="the artifact, as `artifacts` lists it")
    p.add_argument("dest", help="the file to write; its suffix picks the format unless --format is given")
    p.add_argument("--format", choices=["parquet", "csv", "jsonl"], default=None)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("keep", help="keep a finished job from the server's retention (--undo: stop keeping it)")
    p.add_argument("id")
    p.add_argument("--undo", action="store_true", help="stop keeping it: it expires after the retention period")
    p.set_defaults(func=cmd_keep)

    p = sub.add_parser("delete", help="delete a finished job with its result and files (a running one is canceled)")
    p.add_argument("id")
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("artifacts", help="list a job's artifacts, or download them")
    p.add_argument("id")
    p.add_argument("--download", metavar="DIR", default=None, help="download into DIR")
    p.add_argument("--name", action="append", help="only this artifact (repeatable)")
    p.set_defaults(func=cmd_artifacts)

    p = sub.add_parser("kinds", help="the job kinds the server runs: name, route, queue, summary")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_kinds)

    p = sub.add_parser("models", help="registered models and datasets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    return parser


def _report(prefix: str, message: str) -> None:
    print(f"{prefix}: {message}", file=sys.stderr)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    handlers: list[tuple[type[BaseException], int, Callable[[Any], str]]] = [
        (UsageError, EXIT_USAGE, str),
        (ValidationError, EXIT_USAGE, lambda e: "request refused: " + "; ".join(map(str, e.errors))),
        (JobFailedError, EXIT_FAILED, lambda e: f"job {e.job.id} failed: {e.code}: {e.message}"),
        (JobCanceledError, EXIT_CANCELED, lambda e: f"job {e.job.id} canceled: {e.code}: {e.message}"),
        (WaitTimeoutError, EXIT_TIMEOUT, lambda e: f"{e}; it keeps running on the server: follow it with "
         f"`explainq-client status {e.job.id} --follow`, or stop it with `explainq-client cancel {e.job.id}`"),
        (APIError, EXIT_API, lambda e: f"{e.status_code} {e.code}: {e.message}"),
        (APIConnectionError, EXIT_API, lambda e: f"cannot reach the server: {e}"),
        (ExplainqError, EXIT_API, str),
    ]
    try:
        with Client(args.url, args.api_key, max_retries=args.max_retries) as client:
            return args.func(client, args)
    except tuple(h[0] for h in handlers) as exc:
        for cls, code, describe in handlers:
            if isinstance(exc, cls):
                if isinstance(exc, JobFailedError | JobCanceledError):
                    _print_json(exc.job.data)
                _report("error", describe(exc))
                return code
        raise


def main() -> None:
    """The ``explainq-client`` console script."""
    try:
        code = run()
        sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's flush at exit
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and no traceback. Point stdout at /dev/null so
        # the interpreter's own flush at exit does not fail on it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_PIPE
    sys.exit(code)


__all__ = ["EXIT_PIPE", "ProgressBar", "build_parser", "main", "run"]
