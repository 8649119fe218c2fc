"""The writer on a full filesystem (a small tmpfs the test mounts and fills): every write of a group-commit batch
is refused storage_full (retryable, never transaction_aborted or commit_failed), the condition is set once, and
``recheck_full`` clears it only once there is room and a write commits; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from storage import Database, memories
from storage.errors import StorageCode, StorageError
from tests.faults import fill, tmpfs
from tests.storage.storage_helpers import make_memory

TMPFS_BYTES = 4 * 1024 * 1024


async def test_a_full_disk_refuses_a_whole_batch_as_storage_full_and_clears_when_space_returns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with tmpfs(tmp_path / "fs", TMPFS_BYTES) as fs:
        db = await Database.open(fs / "memory.db")
        try:
            stored = [make_memory(content="before " * 50) for _ in range(50)]
            await asyncio.gather(*(db.write(memories.insert, m) for m in stored))
            await asyncio.to_thread(fill, fs / "filler")
            with caplog.at_level(logging.INFO, logger="storage"):
                batch = [make_memory(content="during " * 200) for _ in range(64)]
                results = await asyncio.gather(*(db.write(memories.insert, m) for m in batch),
                                               return_exceptions=True)
                refused = [r for r in results if isinstance(r, BaseException)]
                stored += [m for m, r in zip(batch, results, strict=True) if not isinstance(r, BaseException)]
                assert refused and all(isinstance(r, StorageError) and r.code == StorageCode.STORAGE_FULL
                                       for r in refused), refused
                assert await db.recheck_full() is True  # no room yet: no probe write, still full
                assert [c.code for c in db.health.conditions()] == [StorageCode.STORAGE_FULL]

                (fs / "filler").unlink()
                assert await db.recheck_full() is False
                after = make_memory(content="after")
                await db.write(memories.insert, after)
                stored.append(after)
            assert [r.getMessage() for r in caplog.records] == ["storage_full", "storage_space_available"]
            assert db.health.conditions() == []
            got = await db.read(memories.get_many, [m.id for m in stored])
            assert set(got) == {m.id for m in stored}
        finally:
            await db.close()
