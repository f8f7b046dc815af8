"""Batch storage: the `StorageHandler` protocol and its S3 and local-filesystem handlers.

`make_storage(config)` picks the handler named by `config.storage.kind`.
"""

from __future__ import annotations

from memq.config import MemqConfig
from memq.errors import ConfigError
from memq.storage.base import ObjectInfo, ObjectLocation, StorageHandler
from memq.storage.file_handler import FileStorageHandler
from memq.storage.metrics import StorageMetrics
from memq.storage.s3_handler import S3StorageHandler

__all__ = ["FileStorageHandler", "ObjectInfo", "ObjectLocation", "S3StorageHandler",
           "StorageHandler", "StorageMetrics", "make_storage", "retry_budget_s"]


def retry_budget_s(config: MemqConfig) -> float:
    """How long a storage call may retry: s3.retry_budget_s, capped so that a batch retried that
    long still leaves a third of the producer's request timeout for its notify and ack."""
    return min(config.s3.retry_budget_s, config.producer.request_timeout_ms / 1000 * 2 / 3)


def make_storage(config: MemqConfig, *, metrics: StorageMetrics | None = None) -> StorageHandler:
    """The handler for `config.storage.kind`; `metrics` (one per Prometheus registry) is shared if given."""
    if config.storage.kind == "s3":
        return S3StorageHandler(config.s3, cluster=config.cluster.name, metrics=metrics,
                                retry_budget_s=retry_budget_s(config))
    if config.storage.kind == "file":
        if not config.storage.root_dir:
            raise ConfigError("storage.root_dir must be set when storage.kind = 'file'")
        return FileStorageHandler(config.storage.root_dir, cluster=config.cluster.name, metrics=metrics)
    raise ConfigError(f"storage.kind {config.storage.kind!r} is not one of s3, file")
