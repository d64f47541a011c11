"""The one way to say where work runs (`Placement`, from --workers/--gpus/--cluster) and the Dask
cluster behind it: one worker process per GPU, pinned with CUDA_VISIBLE_DEVICES and holding the Dask
resource GPU=1, one task at a time (so at most one timed job per GPU and nothing else on it meanwhile),
or N one-task CPU workers. `mini-kv worker ADDRESS` starts the same workers for an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass

from mini_kv import jail
from mini_kv.errors import UserError

GPU = "GPU"  # the Dask resource a GPU worker holds and a GPU task asks for


@dataclass(frozen=True)
class Placement:
    """Where a batch runs. Nothing set: here, in this process, one item after the other."""

    workers: int | None = None  # CPU workers of an embedded cluster; Slurm: how many jobs (one GPU each)
    gpus: tuple[int, ...] = ()  # one embedded worker per GPU
    cluster: str | None = None  # tcp://HOST:PORT (or tls://), or 'slurm'
    retries: int = 2  # worker deaths one item survives before it is recorded as WORKER_LOST
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def here(self) -> bool:
        return not (self.workers or self.gpus or self.cluster)


def add_arguments(p) -> None:
    """The placement options of verify, bench and batch."""
    from mini_kv import cli_checks as checks

    g = p.add_argument_group("where it runs (docs/distributed.md)")
    g.add_argument("--workers", type=checks.positive_int, help="an embedded Dask cluster of N CPU workers")
    g.add_argument("--gpus", help="'all' or '0,1,...': an embedded Dask cluster, one worker per GPU")
    g.add_argument("--cluster", help="tcp://HOST:PORT of a running scheduler, or 'slurm' (dask-jobqueue)")
    g.add_argument(
        "--retries",
        type=checks.nonnegative_int,
        default=Placement.retries,
        help=f"worker deaths an item survives before it is recorded as WORKER_LOST (default {Placement.retries})",
    )
    g.add_argument("--tls-ca-file", type=checks.existing_file, help="Dask TLS: the CA certificate")
    g.add_argument("--tls-cert", type=checks.existing_file, help="Dask TLS: this side's certificate")
    g.add_argument("--tls-key", type=checks.existing_file, help="Dask TLS: this side's private key")


def placement_from(args) -> Placement:
    if args.gpus and args.workers and args.cluster != "slurm":
        raise UserError("--gpus and --workers: give one (one worker per GPU, or N CPU workers)")
    if args.cluster and args.gpus:
        raise UserError("--cluster and --gpus: the cluster's workers hold the GPUs (mini-kv worker --gpus)")
    if args.cluster and args.cluster != "slurm" and "://" not in args.cluster:
        raise UserError(f"--cluster {args.cluster!r}: expected tcp://HOST:PORT, tls://HOST:PORT or 'slurm'")
    warn_oversubscribed(args.workers)
    from mini_kv.cli_common import options_from

    return options_from(Placement, args, gpus=tuple(parse_gpus(args.gpus)))


# A CPU worker times on a core of its own: torch's kernels use more than one thread each, so workers
# beyond half the cores share cores, slow each other down and make their timings noisy
CORES_PER_CPU_WORKER = 2


def warn_oversubscribed(workers: int | None) -> None:
    cores = os.cpu_count() or 1
    if workers and workers > 1 and workers * CORES_PER_CPU_WORKER > cores:
        print(
            f"warning: --workers {workers} on {cores} cores: CPU workers share cores, so the batch is likely "
            f"slower than one worker and its timings noisier; use at most --workers {max(1, cores // CORES_PER_CPU_WORKER)} "
            "here, or more machines (--cluster)",
            file=sys.stderr,
        )


def parse_gpus(spec: str | None) -> list[int]:
    if spec is None:
        return []
    import torch

    count = torch.cuda.device_count()
    if spec == "all":
        if count == 0:
            raise UserError("--gpus all: torch sees no CUDA device")
        return list(range(count))
    try:
        gpus = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--gpus {spec!r}: expected 'all' or a comma-separated list of GPU indices") from None
    bad = [g for g in gpus if not 0 <= g < count]
    if bad or not gpus:
        raise UserError(f"--gpus {spec!r}: GPU(s) {bad or spec} not among the {count} visible")
    return gpus


def security(p: Placement, server: bool = False):
    """Dask's TLS settings from --tls-*, or None (plain TCP: loopback or a closed network only)."""
    if not (p.tls_ca_file or p.tls_cert):
        return None
    from distributed.security import Security

    side = "worker" if server else "client"
    return Security(
        tls_ca_file=p.tls_ca_file,
        require_encryption=True,
        **{f"tls_{side}_cert": p.tls_cert, f"tls_{side}_key": p.tls_key},
    )


def worker_specs(gpus: list[int], n_cpu: int, host: str | None = None) -> dict[str, dict]:
    """Nanny options by worker name: one per GPU (pinned, resource GPU=1) or `n_cpu` CPU workers; every
    worker runs one task at a time and leaves memory limits to the candidate's own child."""
    base = {"nthreads": 1, "memory_limit": 0, "silence_logs": logging.WARNING}
    if host:
        base["host"] = host
    if gpus:
        return {
            f"{socket.gethostname()}-gpu{g}": {
                **base,
                "env": {"CUDA_VISIBLE_DEVICES": str(g)},
                "resources": {GPU: 1},
            }
            for g in gpus
        }
    return {f"{socket.gethostname()}-cpu{i}": dict(base) for i in range(n_cpu)}


def _embedded(p: Placement):
    """A SpecCluster (LocalCluster's base) on loopback: the scheduler in this process, workers as
    processes under nannies. `allowed-failures` is read by the scheduler when it starts."""
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    specs = worker_specs(list(p.gpus), p.workers or 0, host="127.0.0.1")
    with dask.config.set({"distributed.scheduler.allowed-failures": p.retries}):
        return SpecCluster(
            # the workers are this command's own: a failure of theirs reaches the user as the task's
            # error, while on Ctrl-C their heartbeats to the scheduler closing first log tracebacks
            # (from their own processes, which the interrupt's log level does not reach) under the one line
            workers={
                name: {"cls": Nanny, "options": {**o, "name": name, "silence_logs": logging.CRITICAL}}
                for name, o in specs.items()
            },
            scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0"}},
            silence_logs=logging.ERROR,  # a nanny's notes on closing its worker are not the user's concern
        )


def slurm_cluster(p: Placement, **overrides):
    """dask-jobqueue's SLURMCluster: its settings from the Dask config (`jobqueue.slurm`, e.g.
    ~/.config/dask/jobqueue.yaml: queue, account, memory, walltime, ...), each job one worker on one GPU
    (`--gres=gpu:1`, Slurm sets CUDA_VISIBLE_DEVICES) holding the resource GPU=1 and running one task."""
    import dask
    from dask_jobqueue import SLURMCluster

    settings = {
        "cores": 1,
        "processes": 1,
        "memory": dask.config.get("jobqueue.slurm.memory", None) or "16GB",
        "job_extra_directives": ["--gres=gpu:1"],
        "worker_extra_args": ["--resources", f"{GPU}=1"],  # cores=processes=1: one thread, one task
        **overrides,
    }
    with dask.config.set({"distributed.scheduler.allowed-failures": p.retries}):
        return SLURMCluster(**settings)


@contextlib.contextmanager
def connect(p: Placement):
    """A Dask client for `p` (not `here`); an embedded or Slurm cluster is shut down on the way out."""
    try:
        from distributed import Client
    except ImportError:
        raise UserError(
            "running on a cluster needs Dask: pip install 'mini-kv[dist]' (dask, distributed)"
        ) from None
    own = None
    if p.cluster == "slurm":
        own = slurm_cluster(p)
        own.scale(jobs=p.workers or 1)
    elif p.cluster is None:
        own = _embedded(p)
    try:
        try:
            client = Client(own or p.cluster, security=security(p), timeout="30s")
        except OSError as exc:
            raise UserError(f"--cluster {p.cluster}: cannot reach the scheduler: {exc}") from None
        with client:
            yield client
    except KeyboardInterrupt:
        # Ctrl-C: the caller prints one line; Dask's own shutdown noise (workers and nannies that log
        # their interrupted tasks with tracebacks) would bury it
        logging.getLogger("distributed").setLevel(logging.CRITICAL + 1)
        raise
    finally:
        if own is not None:
            workers = _worker_pids(own)
            own.close()
            if p.cluster is None:  # this command's own workers: the scratch dirs a stopped one left
                jail.sweep_scratch_of(workers)


def _worker_pids(cluster) -> list[int]:
    """The pids of an embedded cluster's worker processes (under its nannies), where they can be read."""
    pids = []
    for nanny in getattr(cluster, "workers", {}).values():
        pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def dashboard(client) -> str | None:
    """The dashboard's address when the scheduler serves one (it needs bokeh), else None."""
    services = client.scheduler_info().get("services") or {}
    return client.dashboard_link if "dashboard" in services else None


def serve(address: str, p: Placement, gpus: list[int], n_cpu: int) -> None:
    """`mini-kv worker`: the workers of this machine for the scheduler at `address`, until interrupted."""
    import asyncio

    from distributed import Nanny

    async def run() -> None:
        nannies = [
            Nanny(address, name=name, security=security(p, server=True), **opts)
            for name, opts in worker_specs(gpus, n_cpu).items()
        ]
        await asyncio.gather(*nannies)  # a Nanny is awaitable: it starts its worker process
        try:
            await asyncio.gather(*(n.finished() for n in nannies))
        finally:
            await asyncio.gather(*(n.close() for n in nannies), return_exceptions=True)

    asyncio.run(run())
