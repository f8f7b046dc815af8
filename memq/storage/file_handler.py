"""Local-filesystem storage handler (a local disk, NFS or a mounted DFS), same key layout as S3.

Writes are atomic and durable: a temp file in the target directory, fsync, rename over the
final name, fsync the directory. A reader therefore sees a whole batch or nothing, also
after a crash. Blocking file calls run in a bounded thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry

from memq.errors import InvalidInputError, ObjectNotFoundError, StorageError
from memq.storage.base import Chunks, DeleteFailure, ObjectInfo, ObjectLocation, delete_chunks
from memq.storage.metrics import StorageMetrics
from memq.storage.listing import list_all_prefixes
from memq.storage.naming import check_name, group_home, home_dir, make_key, parse_key, parse_name, topic_home
from memq.storage.payload import check_range

T = TypeVar("T")


class FileStorageHandler:
    """`StorageHandler` on a directory tree; locations have bucket "" and keys relative to the root."""

    backend = "file"

    def __init__(self, root_dir: str | os.PathLike[str], *, cluster: str,
                 metrics: StorageMetrics | None = None, max_workers: int = 8) -> None:
        check_name("cluster.name", cluster)
        if max_workers < 1:
            raise InvalidInputError(f"max_workers {max_workers} must be >= 1")
        self.root = Path(root_dir).resolve()
        self.cluster = cluster
        self._metrics = metrics or StorageMetrics(CollectorRegistry())
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"storage.root_dir {self.root}: cannot create: {exc.strerror}") from exc
        self._max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="memq-file")

    async def _run(self, op: str, what: str, fn: Callable[[], T]) -> T:
        """Run a blocking call in the pool; map OS errors to memq's storage errors naming `what`."""
        started = time.perf_counter()
        self._metrics.sent(self.backend, op, what)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except FileNotFoundError as exc:
            self._metrics.failures.labels(self.backend, op, "not_found").inc()
            raise ObjectNotFoundError(f"{op} {what}: object does not exist") from exc
        except OSError as exc:
            self._metrics.failures.labels(self.backend, op, "os_error").inc()
            raise StorageError(f"{op} {self.root / what}: {exc.strerror or exc}") from exc
        finally:
            self._metrics.latency.labels(self.backend, op).observe(time.perf_counter() - started)

    def _path(self, loc: ObjectLocation) -> Path:
        """The file of a location; only well-formed batch keys, so no key escapes the root."""
        if loc.bucket:
            raise InvalidInputError(f"{loc}: the file handler's locations have bucket ''")
        parse_key(loc.key)
        return self.root / loc.key

    # --- StorageHandler ------------------------------------------------------------------------

    async def put_batch(self, topic: str, data: Chunks, *, first_request_id: int,
                        timestamp_ms: int, broker_id: str, group: str = "") -> ObjectLocation:
        key = str(make_key(cluster=self.cluster, topic=topic, first_request_id=first_request_id,
                           timestamp_ms=timestamp_ms, broker_id=broker_id,
                           unique=secrets.token_hex(8), attempt=0, group=group))
        try:  # written chunk by chunk: no concatenation at all
            views = [memoryview(data)] if isinstance(data, (bytes, bytearray, memoryview)) \
                else [memoryview(c) for c in data]
        except TypeError:
            raise InvalidInputError(f"batch data must be bytes or a sequence of bytes-like chunks, "
                                    f"not {type(data).__name__}") from None
        await self._run("put", key, lambda: self._write_atomic(self.root / key, views))
        self._metrics.moved(self.backend, "put", key, sum(v.nbytes for v in views))
        return ObjectLocation("", key)

    @staticmethod
    def _write_atomic(path: Path, views: list[memoryview]) -> None:
        _make_dirs_durable(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for v in views:
                    f.write(v)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)

    async def get(self, loc: ObjectLocation) -> bytes:
        path = self._path(loc)
        data = await self._run("get", loc.key, path.read_bytes)
        self._metrics.moved(self.backend, "get", loc.key, len(data))
        return data

    async def get_range(self, loc: ObjectLocation, start: int, length: int) -> bytes:
        check_range(start, length)
        path = self._path(loc)

        def read() -> bytes:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start >= size:
                    raise StorageError(f"get_range {loc.key}: start {start} is beyond the object's "
                                       f"{size} bytes (InvalidRange)")
                f.seek(start)
                return f.read(length)

        data = await self._run("get_range", loc.key, read)
        self._metrics.moved(self.backend, "get_range", loc.key, len(data))
        return data

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        return await self._list_home(topic_home(topic), start_ms, end_ms, all_attempts)

    async def list_group(self, group: str, start_ms: int, end_ms: int, *,
                         all_attempts: bool = False) -> list[ObjectInfo]:
        return await self._list_home(group_home(group), start_ms, end_ms, all_attempts)

    async def _list_home(self, home: str, start_ms: int, end_ms: int, all_attempts: bool) -> list[ObjectInfo]:
        if end_ms <= start_ms:
            return []

        def list_prefix(prefix: str) -> Awaitable[list[ObjectInfo]]:
            rel = home_dir(prefix, self.cluster, home)
            return self._run("list", rel, lambda: self._list_dir(rel, start_ms, end_ms))

        return await list_all_prefixes(list_prefix, self._max_workers, all_attempts=all_attempts)

    def _list_dir(self, rel: str, start_ms: int, end_ms: int) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        try:
            entries = list(os.scandir(self.root / rel))
        except FileNotFoundError:
            return out
        for e in entries:
            try:
                ts = parse_name(e.name)[0]  # temp files (".name.xxx.tmp") do not parse: skipped
            except InvalidInputError:
                continue
            if start_ms <= ts < end_ms:
                try:
                    size = e.stat().st_size
                except FileNotFoundError:
                    continue  # deleted while listing
                out.append(ObjectInfo(ObjectLocation("", rel + e.name), size, ts))
        return out

    async def delete(self, loc: ObjectLocation) -> None:
        path = self._path(loc)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                _fsync_dir(path.parent)

        await self._run("delete", loc.key, remove)

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        """Unlink `DELETE_CHUNK` files per pool call (op "delete_many"), each directory fsynced once."""
        for loc in locs:
            self._path(loc)   # validate every key before removing any
        failures: list[DeleteFailure] = []

        def remove(chunk: Sequence[ObjectLocation]) -> None:
            dirs: set[Path] = set()
            for loc in chunk:
                path = self.root / loc.key
                try:
                    path.unlink()
                    dirs.add(path.parent)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    failures.append(DeleteFailure(loc, exc.strerror or str(exc)))
            for d in dirs:
                _fsync_dir(d)

        for chunk in delete_chunks(locs):
            await self._run("delete_many", f"{len(chunk)} objects from {chunk[0].key}", functools.partial(remove, chunk))
        return failures

    def pressure(self) -> float:
        return 0.0   # a filesystem never asks for fewer requests

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True)


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new child) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs_durable(path: Path) -> None:
    """mkdir -p, fsyncing the parent of each directory it creates."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    if not missing:
        return
    path.mkdir(parents=True, exist_ok=True)
    for d in reversed(missing):
        _fsync_dir(d.parent)
