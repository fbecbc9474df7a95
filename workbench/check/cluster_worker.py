"""What travels to a Dask worker for a check, and what the worker runs: the subject packed on
the client (:func:`ship`) and unpacked on the worker (:func:`arrive`), and one shard of seeds
run there (:func:`run_shard`, :func:`run_study_shard`).

The subject reaches the worker in the form that keeps its crash to its case: a callable
importable by ``module:qualname`` is sent as that path and imported there; any other callable
is pickled by value (cloudpickle) and served by :mod:`workbench.check.cluster_callables`, so
either runs in a process of its own (:mod:`workbench.check.isolation`); a kernels folder is
read on the client (the user's files only read) and written under the worker's temporary
folder; any other form goes as Dask pickles it. One shard runs at a time in a worker process
(a lock): MLX is not thread-safe across streams, so one MLX context a process, whatever the
worker's thread count.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import files, validate

#: The environment variables that set the BLAS and OpenMP thread pools (read at their load).
THREAD_VARIABLES: tuple[str, ...] = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: The most bytes of a kernels folder sent to the workers (kernel texts are kilobytes; a
#: folder past this is not a kernels folder, or holds what should not travel).
MAX_FOLDER_BYTES = 64 * 2**20

_ONE_AT_A_TIME = threading.Lock()


@dataclass(frozen=True)
class Shipped:
    """A subject as it travels: ``form`` is ``"path"`` (``payload`` a ``module:qualname``),
    ``"by value"`` (cloudpickle bytes), ``"kernels folder"`` (relative path -> bytes) or
    ``"object"`` (the subject itself); ``options`` rebuild the form on the worker."""

    form: str
    payload: Any
    options: dict[str, Any] = field(default_factory=dict)


def _folder_files(folder: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    total = 0
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            total += len(data)
            if total > MAX_FOLDER_BYTES:
                raise ValueError(
                    f"folder: {folder} holds more than {MAX_FOLDER_BYTES} bytes, too much to send to the "
                    "workers (a kernels folder holds kilobytes of text)"
                )
            out[p.relative_to(folder).as_posix()] = data
    return out


def ship(subject: Any) -> Shipped:
    """``subject`` (a form of :mod:`workbench.check.subjects`) packed for the workers."""
    from workbench.check.subjects import CallableSubject, KernelsFolderSubject

    if isinstance(subject, CallableSubject):
        opts = {"arrays": subject.arrays, "batched": subject.batched, "name": subject.name, "process": subject.process}
        if subject.path:
            return Shipped("path", subject.path, opts)
        import cloudpickle

        try:
            data = cloudpickle.dumps(subject.fn)
        except Exception as e:  # what cloudpickle cannot pickle (a lock, an open file) it says in its own terms
            raise ValueError(
                f"subject: {validate.describe(subject.fn)} cannot be sent to the workers "
                f"(cloudpickle: {type(e).__name__}: {e}); make it importable by module:function"
            ) from None
        return Shipped("by value", data, opts)
    if isinstance(subject, KernelsFolderSubject):
        opts = {"backend": subject.backend, "order": subject.order, "name": subject.name, "process": subject.process}
        return Shipped("kernels folder", _folder_files(subject.folder), opts)
    return Shipped("object", subject)


def _written_folder(texts: dict[str, bytes]) -> Path:
    """The kernels folder's files under this machine's temporary folder, once a content."""
    h = hashlib.sha256()
    for name, data in sorted(texts.items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    where = Path(tempfile.gettempdir()) / "workbench-cluster-kernels" / h.hexdigest()[:32]
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=where.parent))
        for name, data in texts.items():
            files.write_atomic(staging / name, data)
        try:
            os.replace(staging, where)  # atomic: another worker of this machine sees all the files or none
        except OSError:  # another worker wrote the same content first
            shutil.rmtree(staging, ignore_errors=True)
    return where


def arrive(shipped: Shipped) -> Any:
    """The subject ``shipped`` describes, rebuilt on this worker."""
    from workbench.check import cluster_callables
    from workbench.check.subjects import CallableSubject, KernelsFolderSubject, load

    o = shipped.options
    if shipped.form == "path":
        try:
            fn = load(shipped.payload)
        except Exception as e:  # the user's module, failing on this worker
            raise ValueError(
                f"subject: {shipped.payload} cannot be imported on this worker ({type(e).__name__}: {e}); "
                "install the module on the workers, or pass the function itself (sent by value)"
            ) from None
        return CallableSubject(fn, arrays=o["arrays"], batched=o["batched"], name=o["name"], process=o["process"])
    if shipped.form == "by value":
        fn = cluster_callables.register(shipped.payload)
        return CallableSubject(fn, arrays=o["arrays"], batched=o["batched"], name=o["name"], process=o["process"])
    if shipped.form == "kernels folder":
        return KernelsFolderSubject(
            _written_folder(shipped.payload), backend=o["backend"], order=o["order"], name=o["name"]
        )
    return shipped.payload


@dataclass
class ShardResult:
    """What a shard sends back: its ``result`` (a report or a table), the seconds it took on the
    worker, the worker's process id and thread settings (:data:`THREAD_VARIABLES`)."""

    result: Any
    seconds: float
    pid: int
    threads: dict[str, str]


def thread_settings() -> dict[str, str]:
    """This process's :data:`THREAD_VARIABLES` as set (``"unset"``: the library's default, all cores)."""
    return {v: os.environ.get(v, "unset") for v in THREAD_VARIABLES}


def run_shard(check: Any, shipped: Shipped, seeds: list[int], options: dict[str, Any]) -> ShardResult:
    """``check(subject, seeds=seeds, **options)`` on this worker (``check``: the serial check
    function, passed in rather than imported, so this module does not depend on it)."""
    with _ONE_AT_A_TIME:
        subject = arrive(shipped)
        t0 = time.perf_counter()
        out = check(subject, seeds=seeds, **options)
        return ShardResult(out, time.perf_counter() - t0, os.getpid(), thread_settings())


def run_study_shard(study: Any, options: dict[str, Any]) -> ShardResult:
    """``study(**options)`` (a sweep of :mod:`workbench.studies.sweeps`) on this worker."""
    with _ONE_AT_A_TIME:
        t0 = time.perf_counter()
        out = study(**options)
        return ShardResult(out, time.perf_counter() - t0, os.getpid(), thread_settings())
