"""A batch: task cards' candidates (`verify`) and problems' solutions (`bench`) as `Item`s, run by the
one pipeline here or on a cluster's workers, with one progress display and one list of results.

On a worker an item runs exactly as here (build in the worker's own cache, the isolated child, the
integrity Guard), but writes its attempt to a scratch outbox; the worker sends the attempt's files back
as bytes with their SHA-256 and the client alone stores them (`receive`): every hash checked against the
data and the attempt's own manifest, written as `.partial`, renamed whole, indexed. A worker that dies
mid-item (SIGKILL, a lost machine) sends nothing: Dask runs the item again on another worker, up to
--retries deaths, then the item is WORKER_LOST. A candidate's own crash or hang is a result, handled
inside the child protocol, and never kills the worker."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import threading
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from mini_kv.codec import to_json
from mini_kv.errors import ExitCode, UserError
from mini_kv.settings import DEFAULTS
from mini_kv.status import Status

if TYPE_CHECKING:
    from mini_kv.compile.compiler import CompileRecord
    from mini_kv.pipeline import ReferenceCache, VerifyResult
    from mini_kv.solexec.run import BenchResult
    from mini_kv.solexec.traces import Trace

VERIFY, BENCH = "verify", "bench"


@dataclass(frozen=True)
class Item:
    """One unit of a batch. `opts` is a pipeline.VerifyOptions or a solexec.run.BenchOptions."""

    kind: str  # VERIFY or BENCH
    label: str  # how progress lines and the summary name it
    target: str  # the task card (verify) or the problem directory (bench)
    candidate: str | None  # verify's candidate id
    opts: object
    store: str  # the attempt store the client writes into


@dataclass(frozen=True)
class ItemResult:
    """An item's result: its headline status and exit code, the attempt it stored and the worker it ran
    on; `detail`, its front door's own result (verify's, for report.print_verify; bench's, for
    solexec.table.print_report), or without one (no attempt: its workers died, an error on the worker) why."""

    kind: str  # the item's: VERIFY or BENCH
    label: str
    candidate: str | None  # a card's candidate id (None: a SOL solution's result)
    status: str
    exit_code: ExitCode
    attempt: str | None
    detail: VerifyResult | BenchResult | None = None
    reason: str | None = None
    where: dict | None = None  # host, worker, gpu


def run_item(
    item: Item,
    progress=None,
    line=None,
    outbox: Path | None = None,
    references: ReferenceCache | None = None,
    door=None,
    built_ahead: CompileRecord | None = None,
) -> ItemResult:
    """The item through the pipeline (verify or bench), as the command would run it here. `references`: the
    batch's reference timings (pipeline.ReferenceCache), unless the item asks for interleaving. `door`: the
    item's door with its worker started ahead (evaluate_here), else made here. `built_ahead`: its build
    as the batch made it ahead (a failure on the sources is not compiled again)."""
    from mini_kv.settings import switch_from_environment

    if switch_from_environment("interleave_reference", item.opts.interleave_reference):
        references = None
    door = door if door is not None else door_of(item)
    door.build_ahead = built_ahead
    if item.kind == VERIFY:
        from mini_kv.pipeline import VerifyResult, run_stages

        run = run_stages(door, progress, line, outbox, references)
        detail = VerifyResult.of(door.cand.id, run)
        return ItemResult(
            VERIFY, item.label, door.cand.id, run.summary["status"], run.code, str(run.attempt), detail
        )
    from mini_kv.solexec.run import bench

    say = progress and (lambda msg, **_: progress(msg))
    detail = bench(item.target, item.opts, say, line, outbox, references, door=door)
    return ItemResult(BENCH, item.label, None, detail.status, detail.exit_code, detail.attempt, detail)


def door_of(item: Item):
    """The item's front door (pipeline.CardDoor or solexec.run.SolDoor), not yet prepared."""
    if item.kind == VERIFY:
        from mini_kv.load.task_card import load_task_card
        from mini_kv.pipeline import CardDoor

        card = load_task_card(item.target, import_modules=False)  # CardDoor.prepare imports its modules
        return CardDoor(card, card.candidate(item.candidate), item.opts)
    from mini_kv.solexec.run import sol_door

    return sol_door(item.target, item.opts)


def started_ahead(item: Item, ahead: bool = True):
    """`item`'s door with its worker (judge and subject) started now, ahead of its turn
    (runner.AheadOfTurn) unless `ahead` is false; None where that fails: the item's own run meets the
    error in its turn."""
    door = None
    try:
        door = door_of(item)
        door.start_worker(ahead=ahead)
        return door
    except BaseException as exc:
        if door is not None:  # its worker ends, whatever stopped it (Ctrl-C too)
            door.close()
        if not isinstance(exc, Exception):
            raise
        return None


def item_key(item: Item) -> tuple[str, str, str]:
    """What a results file knows an item by: a card's (verify, task, candidate), a SOL solution's
    (bench, definition name, solution name), the names its traces carry. A tuple, never the names joined:
    SOL names may contain "/" (definition "a/b" with solution "c" is not definition "a" with "b/c")."""
    if item.kind == VERIFY:
        task, candidate = item.label.split("/", 1)  # a card's id is an identifier: no "/" in it
        return (VERIFY, task, candidate)
    definition = json.loads((Path(item.target) / "definition.json").read_text(encoding="utf-8"))["name"]
    solution = json.loads(Path(item.opts.solution).read_text(encoding="utf-8"))["name"]
    return (BENCH, definition, solution)


def line_key(line: dict) -> tuple[str, str, str] | None:
    """The item a results file's line belongs to (item_key's tuple), or None for a line that is neither
    a card's summary line nor a SOL trace. Both kinds of line carry their names in fields of their own
    (a card's `item` is `task/candidate`, the task an identifier), so files written before the key was a
    tuple read the same."""
    if isinstance(line.get("item"), str) and "/" in line["item"]:
        task, candidate = line["item"].split("/", 1)
        return (VERIFY, task, candidate)
    if isinstance(line.get("definition"), str) and isinstance(line.get("solution"), str):
        return (BENCH, line["definition"], line["solution"])
    return None


def check_distinct_keys(items: list[Item]) -> None:
    """A results file cannot tell apart two SOL solutions of one definition with the same name: with
    one, a resumed run would skip the second as done. Refused before anything runs."""
    seen: dict[tuple[str, str, str], Item] = {}
    for item in items:
        key = item_key(item)
        if key in seen:
            first = seen[key]
            raise UserError(
                f"{getattr(item.opts, 'solution', item.label)}: solution name {key[2]!r} of definition "
                f"{key[1]!r} is also the name of {getattr(first.opts, 'solution', first.label)}; a results "
                "file knows a solution by its definition and solution names, so they must differ"
            )
        seen[key] = item


def result_lines(item: Item, result: ItemResult) -> list[dict] | list[Trace]:
    """An item's lines in a results file: a SOL item's traces (upstream's trace format, one per workload),
    a card item's summary line. An item that got no result (its worker was lost) has none: a resumed run
    runs it again."""
    if result.detail is None:
        return []
    if item.kind == BENCH:
        return list(result.detail.traces)
    return [
        {
            "item": item.label,
            "status": result.status,
            "exit_code": int(result.exit_code),
            "attempt": result.attempt,
        }
    ]


class Journal:
    """Streamed, resumable results: each finished item's lines appended (flushed, fsynced) as it finishes.
    Opened with `resume`, the items the file already holds are done: a second run skips them; a torn last
    line (the run was killed mid-write) is dropped. Without `resume` the file starts empty."""

    def __init__(self, path: Path, resume: bool):
        self.path = Path(path)
        self.done: set[tuple[str, str, str]] = set()
        kept = []
        if resume and self.path.exists():
            for number, raw in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # torn by a kill
                key = line_key(line) if isinstance(line, dict) else None
                if key is None:
                    raise UserError(
                        f"{self.path}: line {number}: neither a SOL trace (definition, solution) nor a "
                        "task card's result (item: task/candidate); not a results file of mini-kv batch "
                        "or bench -o"
                    )
                self.done.add(key)
                kept.append(raw + "\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(kept), encoding="utf-8")

    def record(self, item: Item, result: ItemResult) -> None:
        from mini_kv.solexec import traces

        lines = result_lines(item, result)
        if not lines:
            return
        text = "".join((traces.dumps(x) if item.kind == BENCH else json.dumps(x)) + "\n" for x in lines)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def worst(codes) -> ExitCode:
    """The batch's exit code: the worst of its items' (any failure over success, then the highest)."""
    return ExitCode(max((int(c) for c in codes), key=lambda c: (c != 0, c), default=0))


# ------------------------------------------------------------------------------------ worker side


@dataclass(frozen=True)
class Worker:
    """Where an item ran (the stored attempt's `worker`)."""

    host: str
    worker: str
    address: str
    gpu: str | None  # CUDA_VISIBLE_DEVICES


@dataclass(frozen=True)
class Shipment:
    """An attempt a worker sends back: its files' bytes with their SHA-256, the item's result, and where."""

    result: ItemResult  # run_item's
    task: str
    attempt_id: str
    files: dict[str, tuple[str, bytes]]  # relative path -> (sha256, data)
    where: Worker


@functools.lru_cache(maxsize=1)
def worker_references(batch: str) -> ReferenceCache:
    """A cluster worker process's own reference timings for the items of one batch (it has one GPU): a
    worker serving batch after batch keeps only the current one's."""
    from mini_kv.pipeline import ReferenceCache

    return ReferenceCache()


class WorkerJudges:
    """A cluster worker's kept judges (runner.KeptJudges), for one batch at a time: kept from a batch's
    first item on this worker, as `evaluate_here` keeps them for its items; they end when an item of
    another batch comes, or IDLE_S after the batch's last item here (a worker that serves batch after
    batch holds no judge, and so no GPU memory, between them)."""

    IDLE_S = 30.0
    _lock = threading.Lock()
    _batch: str | None = None  # the batch whose judges are kept here (None: none are)
    _timer: threading.Timer | None = None

    @classmethod
    def serving(cls, batch: str | None) -> None:
        """An item of `batch` (None: a lone item) begins on this worker."""
        from mini_kv.runner import KeptJudges

        with cls._lock:
            if cls._timer is not None:  # the batch's next item came in time
                cls._timer.cancel()
                cls._timer = None
            if cls._batch is not None and batch != cls._batch:
                cls._end()  # the other batch's judges end
            if batch is not None and cls._batch is None:
                KeptJudges.enter()
                cls._batch = batch

    @classmethod
    def served(cls) -> None:
        """The item ended: the batch's judges wait IDLE_S for its next item here."""
        with cls._lock:
            if cls._batch is not None:
                timer = cls._timer = threading.Timer(cls.IDLE_S, lambda: cls._expire(timer))
                timer.daemon = True
                timer.start()

    @classmethod
    def _expire(cls, timer: threading.Timer) -> None:
        # a timer cancelled after it fired (the next item came while it waited for the lock) ends nothing
        with cls._lock:
            if cls._timer is timer:
                cls._timer = None
                cls._end()

    @classmethod
    def _end(cls) -> None:
        from mini_kv.runner import KeptJudges

        KeptJudges.leave()
        cls._batch = None


def on_worker(item: Item, batch: str | None = None) -> Shipment:
    """What a cluster worker runs: the item into a scratch outbox, its attempt packed as data. `batch`: the
    id of a batch of several items, whose reference timings and judges (WorkerJudges) the worker shares
    among its items."""
    from distributed import get_worker

    from mini_kv import jail

    w = get_worker()
    where = Worker(socket.gethostname(), w.name, w.address, os.environ.get("CUDA_VISIBLE_DEVICES"))
    with jail.scratch("outbox") as box:
        refs = worker_references(batch) if batch is not None else None
        WorkerJudges.serving(batch)
        try:
            result = run_item(item, outbox=Path(box), references=refs)
        finally:
            WorkerJudges.served()
        attempt = Path(result.attempt)
        files = [
            (p.relative_to(attempt).as_posix(), p.read_bytes())
            for p in sorted(attempt.rglob("*"))
            if p.is_file()
        ]
    shipped = {rel: (hashlib.sha256(data).hexdigest(), data) for rel, data in files}
    return Shipment(result, attempt.parent.name, attempt.name, shipped, where)


# ------------------------------------------------------------------------------------ client side


class ShipmentInvalid(UserError):
    """An attempt that came back from a worker and does not match its own hashes: never stored."""


def _check_shipment(packed: Shipment) -> dict:
    """attempt.json of a shipped attempt, after checking every file's bytes against the SHA-256 sent with
    it and against the attempt's manifest, and that every name stays inside the attempt."""
    files, attempt_id = packed.files, packed.attempt_id
    bad = [r for r, (sha, data) in files.items() if hashlib.sha256(data).hexdigest() != sha]
    if bad or "attempt.json" not in files:
        raise ShipmentInvalid(f"attempt {attempt_id}: damaged in transit: {bad or 'no attempt.json'}")
    header = json.loads(files["attempt.json"][1])
    listed = {e["path"]: e["sha256"] for e in header["files"]}
    if listed != {r: sha for r, (sha, _) in files.items() if r != "attempt.json"}:
        raise ShipmentInvalid(f"attempt {attempt_id}: its files differ from its manifest")
    for name in [packed.task, attempt_id, *listed]:
        parts = PurePosixPath(name).parts
        if name.startswith("/") or not parts or any(p in ("..", ".") for p in parts):
            raise ShipmentInvalid(f"attempt {attempt_id}: {name!r} is not a plain relative name")
    return header


def receive(store: Path, packed: Shipment) -> tuple[Path, str | None]:
    """Store a shipped attempt (checked, `.partial`, renamed whole, re-read, indexed): where, and why the
    index was not updated (None: it was). Its header gains `worker`: the host, GPU and worker that produced it."""
    from mini_kv.store.atomic import StagedDir, write_bytes
    from mini_kv.store.attempts import read_attempt
    from mini_kv.store.index import IndexUnusable, update_index

    header = _check_shipment(packed)
    staged = StagedDir(Path(store) / packed.task / packed.attempt_id)
    try:
        for rel, (_, data) in packed.files.items():
            if rel != "attempt.json":
                write_bytes(staged.path(rel), data)
        path = staged.publish("attempt.json", {**header, "worker": to_json(packed.where)})
    except BaseException:  # an interrupted client leaves no partial attempt behind
        shutil.rmtree(staged.partial, ignore_errors=True)
        raise
    read_attempt(path)  # every file re-hashed where it now lies
    try:
        update_index(Path(store), path)
    except IndexUnusable as exc:
        return path, str(exc)
    return path, None


def _failed(item: Item, status: str, code: ExitCode, reason: str) -> ItemResult:
    """The result of an item that produced no attempt (its workers died; an error on the worker)."""
    return ItemResult(item.kind, item.label, item.candidate or item.label, status, code, None, reason=reason)


def _outcome(item: Item, future) -> ItemResult:
    """The item's result on the client: its attempt stored, or why there is none."""
    from distributed import KilledWorker

    try:
        packed = future.result()
    except KilledWorker as exc:
        return _failed(
            item, Status.WORKER_LOST, ExitCode.WORKER_LOST, f"every worker that ran it died: {exc}"
        )
    except UserError as exc:  # e.g. a worker that cannot read the task card
        return _failed(item, Status.NOT_RUN, exc.exit_code, f"on the worker: {exc}")
    except Exception as exc:  # noqa: BLE001 - a bug on the worker: this item fails, the batch goes on
        tb = "".join(traceback.format_exception(exc))
        return _failed(item, Status.NOT_RUN, ExitCode.INTERNAL, f"internal error on the worker:\n{tb}")
    try:
        path, warning = receive(Path(item.store), packed)
    except ShipmentInvalid as exc:  # never stored; the other items go on
        return _failed(item, Status.NOT_RUN, ExitCode.INTERNAL, str(exc))
    where = {"host": packed.where.host, "worker": packed.where.worker, "gpu": packed.where.gpu}
    # the door's result as the client stored its attempt (its report prints both)
    detail = replace(packed.result.detail, attempt=str(path), index_warning=warning)
    return replace(packed.result, attempt=str(path), detail=detail, where=where)


def build_item(item: Item) -> CompileRecord | None:
    """The item's build, as its evaluation would make it (cluster.prebuild), into the build cache."""
    from mini_kv.cluster import prebuild

    timeout = getattr(item.opts, "compile_timeout", None) or DEFAULTS.compile_s
    if item.kind == BENCH:
        return prebuild.build_solution(item.target, item.opts.solution, timeout)
    return prebuild.build_card_candidate(item.target, item.candidate, item.opts.device, timeout)


def next_turn(pending: list[int], builds: list, wait: bool) -> int:
    """Which pending item runs next: the first (in the batch's order) whose build is done or that has
    none, so that a solution with nothing to compile never waits behind a cold C++ build of an earlier
    one. Where none is ready: with `wait`, the first whose build finishes; without, the first pending."""
    from concurrent.futures import FIRST_COMPLETED
    from concurrent.futures import wait as wait_for

    while True:
        for i in pending:
            if builds[i] is None or builds[i].done():
                return i
        if not wait:
            return pending[0]
        wait_for([builds[i] for i in pending], return_when=FIRST_COMPLETED)


def grouped(items: list[Item]) -> list[int]:
    """The items' indices with the items of one card or problem together, groups in the order of their
    first item: a judge is kept for items alike (runner.KeptJudges, at most IDLE_MAX kinds), so a batch
    that alternates among three problems would start a judge for nearly every item."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.target, i)
    return sorted(range(len(items)), key=lambda i: first[items[i].target])


def evaluate_here(items: list[Item], show=None) -> Iterator[tuple[Item, ItemResult]]:
    """Each item and its result as it finishes, one after another in this process. On a GPU, every
    item's build starts at once on all cores (cluster.prebuild) while the GPU checks and times the items
    before it, and the items run in the order their builds are ready (`next_turn`): the batch's order
    where nothing is built. The next item's judge and subject start as an item begins (Python, torch,
    opcheck's imports: seconds), and are stopped whole while that item times (runner.AheadOfTurn), so
    their start runs beside its build, correctness rounds and contract checks, never beside a timing;
    where another item's build is ready first, that worker ends unused. At most one evaluation, so one
    timing, is on the device at any moment. The reference of each case is timed in full once for all
    the items (pipeline.ReferenceCache) and re-checked by the later ones. Closing the generator early
    cancels the builds not yet started and ends the worker started ahead. The items of one card or
    problem run one after another (`grouped`), so that one judge serves them."""
    from concurrent.futures import ThreadPoolExecutor

    from mini_kv.cluster import prebuild
    from mini_kv.pipeline import ReferenceCache
    from mini_kv.runner import keep_judges

    several = len(items) > 1
    references = ReferenceCache() if several else None  # one item: timed as a single run is

    ahead = prebuild.overlaps_evaluation({getattr(it.opts, "device", None) for it in items}, len(items))
    pool = ThreadPoolExecutor(prebuild.pool_size(), initializer=prebuild.lower_priority) if ahead else None
    builds = [pool.submit(build_item, item) for item in items] if pool else [None] * len(items)
    pending = grouped(items)
    planned, nxt = None, None  # the item whose worker was started ahead, and its door
    # one judge for the items alike (runner.KeptJudges), a fresh subject for each
    try:
        with keep_judges() if several else contextlib.nullcontext():
            if several:  # the first item's worker before the second's: the second waits for its judge
                planned = next_turn(pending, builds, wait=False)
                nxt = started_ahead(items[planned], ahead=False)
            while pending:
                i = next_turn(pending, builds, wait=True)  # a failed build: its run records it
                if i != planned and nxt is not None:  # another's build was ready first: it ends unused
                    nxt.close()
                door, nxt = (nxt if i == planned else None), None
                pending.remove(i)
                if pending:
                    planned = next_turn(pending, builds, wait=False)
                    nxt = started_ahead(items[planned])
                item = items[i]
                progress, line = (show.row(item.label), show.line) if show is not None else (None, None)
                fut = builds[i]  # done (next_turn): a build that failed is not compiled again in its run
                built = fut.result() if fut is not None and fut.exception() is None else None
                yield (
                    item,
                    run_item(item, progress, line, references=references, door=door, built_ahead=built),
                )
    finally:
        if nxt is not None:  # stopped early (-x, Ctrl-C, an error): its worker ends unused
            nxt.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def run_here(items: list[Item], show, on_result, stop_first: bool = False) -> list[ItemResult]:
    """The items' results in the items' order (evaluate_here may run them in another), each shown and
    handed to `on_result` as it finishes."""
    from contextlib import closing

    order = {id(item): i for i, item in enumerate(items)}
    results: dict[int, ItemResult] = {}
    with closing(evaluate_here(items, show)) as finished:
        for item, result in finished:
            results[order[id(item)]] = result
            show.done(result.label, result.status)
            on_result(item, result)
            if stop_first and result.exit_code != ExitCode.OK:
                break  # -x: nothing more runs
    return [results[i] for i in sorted(results)]


def run_batch(
    items: list[Item], placement, show, on_result=None, stop_first: bool = False
) -> list[ItemResult]:
    """Every item's result, in the items' order. `show` is the batch display (cli_common.BatchDisplay);
    `on_result(item, result)` is called as each item finishes (a results file is written from it)."""
    on_result = on_result or (lambda item, result: None)
    if placement.here:
        return run_here(items, show, on_result, stop_first)
    from distributed import as_completed

    from mini_kv.cluster.cluster import GPU, connect, dashboard

    with connect(placement) as client:
        link = dashboard(client)
        show.note(f"dashboard: {link}" if link else f"scheduler: {client.scheduler.address}")
        workers = client.scheduler_info()["workers"].values()
        need = {GPU: 1} if any(GPU in (w.get("resources") or {}) for w in workers) else None
        batch = uuid.uuid4().hex[:8]
        # submitted with the items of one card or problem together: Dask prefers the tasks submitted
        # first, so a worker's kept judge (WorkerJudges) more often serves the next item of its kind
        futures = {
            client.submit(
                on_worker,
                items[i],
                batch if len(items) > 1 else None,
                key=f"mini-kv-{batch}-{i}",
                resources=need,
                pure=False,
            ): i
            for i in grouped(items)
        }
        results: list[ItemResult | None] = [None] * len(items)
        try:
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = _outcome(items[i], fut)
                show.done(items[i].label, results[i].status, results[i].where)
                on_result(items[i], results[i])
                if stop_first and results[i].exit_code != ExitCode.OK:
                    client.cancel(list(futures), force=True)
                    break
        except BaseException:  # Ctrl-C: nothing more starts; the embedded cluster ends with its workers
            client.cancel(list(futures), force=True)
            raise
        return [r for r in results if r is not None]  # -x leaves the cancelled ones out
