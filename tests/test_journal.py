"""``enforce.journal``: the persisted record of what may be frozen (atomic, durable, never fatal to read)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuagent.enforce.journal import FreezeTarget, Journal, JournalError

A = FreezeTarget("v2", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-a.scope")
B = FreezeTarget("v1", "/kubepods/besteffort/pod2/b")
ODD = FreezeTarget("v2", "/custom jobs/gpu:burn\udce9 test")  # spaces, a colon, a non-UTF-8 byte


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_missing_file_is_an_empty_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "missing" / "journal.json")
    assert journal.entries() == ()
    assert len(journal) == 0 and A not in journal
    assert not (tmp_path / "missing").exists()  # reading creates nothing


def test_add_and_remove_write_the_file_and_are_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.json"
    journal = Journal(path, clock=lambda: 1754562011.5)

    assert journal.add(A, "share 0.3 over 0.25") is True
    assert journal.add(A, "again") is False  # already journaled: no write
    assert journal.add(B, "memory") is True
    assert journal.writes == 2
    assert read(path) == {"version": 1, "entries": [
        {"hierarchy": "v2", "path": A.path, "since": 1754562011.5, "reason": "share 0.3 over 0.25",
         "pid": os.getpid()},
        {"hierarchy": "v1", "path": B.path, "since": 1754562011.5, "reason": "memory", "pid": os.getpid()},
    ]}
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert oct(path.parent.stat().st_mode & 0o777) == oct(0o700)

    assert journal.remove(A) is True
    assert journal.remove(A) is False  # not there: no write
    assert journal.writes == 3
    assert [e["path"] for e in read(path)["entries"]] == [B.path]
    # A fresh reader (the next agent) sees the same.
    again = Journal(path)
    assert [e.target for e in again.entries()] == [B]
    assert again.entries()[0].reason == "memory"


def test_odd_paths_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "journal.json"
    Journal(path).add(ODD, "reason with \"quotes\" and\nnewline")
    (entry,) = Journal(path).entries()
    assert entry.target == ODD
    assert os.fsencode(entry.target.path) == b"/custom jobs/gpu:burn\xe9 test"
    assert path.read_bytes().isascii()


def test_write_is_atomic_rename_of_a_synced_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal file is only ever replaced whole (rename of a temporary in the same directory), after
    fsync of the temporary and followed by fsync of the directory."""
    path = tmp_path / "journal.json"
    journal = Journal(path)
    journal.add(A, "first")
    calls: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        calls.append(("replace", (str(src), str(dst))))
        # At the moment of the rename the old journal is intact and the new one complete.
        assert [e["path"] for e in read(path)["entries"]] == [A.path]
        assert [e["path"] for e in json.loads(Path(str(src)).read_text())["entries"]] == [A.path, B.path]
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    journal.add(B, "second")

    tmp = str(tmp_path / f".journal.json.tmp-{os.getpid()}")
    assert calls == [("fsync", tmp), ("replace", (tmp, str(path))), ("fsync", str(tmp_path))]
    assert not Path(tmp).exists()


def test_a_crash_mid_write_leaves_the_old_journal(tmp_path: Path) -> None:
    """A writer killed after writing its temporary but before the rename: the journal is the old one, and
    the stray temporary is removed (never read) by the next reader."""
    path = tmp_path / "journal.json"
    Journal(path).add(A, "first")
    (tmp_path / ".journal.json.tmp-99999").write_text('{"version": 1, "entries": [{"hierarchy": "v2"')
    journal = Journal(path)
    assert [e.target for e in journal.entries()] == [A]
    assert not (tmp_path / ".journal.json.tmp-99999").exists()


@pytest.mark.parametrize("content", [b"", b"{", b"\x00\x00\x00", b"[1, 2]", b'{"version": 1}', b"not json"])
def test_unreadable_file_is_moved_aside_and_read_as_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / "journal.json"
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR):
        journal = Journal(path)
        assert journal.entries() == ()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0].getMessage() and "corrupt" in errors[0].getMessage()
    (aside,) = tmp_path.glob("journal.json.corrupt-*")
    assert aside.read_bytes() == content
    assert not path.exists()
    journal.add(A, "after")  # the journal works again
    assert [e.target for e in Journal(path).entries()] == [A]


def test_truncated_file_keeps_the_complete_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.json"
    journal = Journal(path)
    for target in (A, B, ODD):
        journal.add(target, "x")
    whole = path.read_bytes()
    path.write_bytes(whole[: whole.index(b'"/custom')])  # cut inside the third entry

    with caplog.at_level(logging.ERROR):
        salvaged = Journal(path)
        assert [e.target for e in salvaged.entries()] == [A, B]
    assert "corrupt" in caplog.text and str(path) in caplog.text and "kept 2" in caplog.text
    assert len(list(tmp_path.glob("journal.json.corrupt-*"))) == 1
    # What was salvaged is written back at once: a crash now still leaves it named.
    assert [e["path"] for e in read(path)["entries"]] == [A.path, B.path]


def test_malformed_entries_are_dropped_and_the_rest_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.json"
    path.write_text(json.dumps({"version": 1, "entries": [
        {"hierarchy": "v2", "path": A.path, "since": 1.0, "reason": "ok", "pid": 7},
        {"hierarchy": "v3", "path": "/kubepods/x"},
        {"hierarchy": "v1", "path": "relative/path"},
        {"hierarchy": "v1", "path": B.path, "since": "yesterday"},
        "not an object",
        {"hierarchy": "v1", "path": B.path},  # defaults for the optional fields
        {"hierarchy": "v1", "path": B.path, "since": 2.0},  # a duplicate: the first wins
    ]}))
    with caplog.at_level(logging.ERROR):
        entries = Journal(path).entries()
    assert [(e.target, e.since, e.pid) for e in entries] == [(A, 1.0, 7), (B, 0.0, 0)]
    assert "malformed" in caplog.text
    assert len(list(tmp_path.glob("journal.json.corrupt-*"))) == 1


def test_reading_never_raises_on_a_directory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.json"
    path.mkdir()
    with caplog.at_level(logging.ERROR):
        assert Journal(path).entries() == ()
    assert str(path) in caplog.text


def test_unwritable_place_raises_journal_error_and_changes_nothing(tmp_path: Path) -> None:
    """As root, file modes do not stop a write: a path below a regular file (ENOTDIR) and /proc do."""
    (tmp_path / "a-file").write_text("")
    for path in (tmp_path / "a-file" / "journal.json", Path("/proc") / f"gpuagent-{uuid.uuid4().hex}.json"):
        journal = Journal(path)
        with pytest.raises(JournalError, match=str(path)):
            journal.add(A, "x")
        assert A not in journal and journal.entries() == ()


def test_disk_full_raises_journal_error_and_keeps_the_old_file(small_tmpfs: Path) -> None:
    path = small_tmpfs / "journal.json"
    journal = Journal(path)
    journal.add(A, "fits")
    before = path.read_bytes()
    filler = small_tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    with pytest.raises(JournalError, match="No space left"):
        journal.add(B, "does not fit " * 1000)
    assert B not in journal
    assert path.read_bytes() == before
    assert [p.name for p in small_tmpfs.iterdir() if p.name.startswith(".")] == []  # no stray temporary
    filler.unlink()


def test_read_only_directory_raises_journal_error(small_tmpfs: Path) -> None:
    path = small_tmpfs / "journal.json"
    Journal(path).add(A, "before")
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    journal = Journal(path)
    assert [e.target for e in journal.entries()] == [A]  # still readable
    with pytest.raises(JournalError, match="Read-only"):
        journal.add(B, "x")
    # remove() logs instead of raising: the file keeps naming A (one harmless thaw at the next start).
    assert journal.remove(A) is True
    assert A not in journal
    assert [e.target for e in Journal(path).entries()] == [A]


def test_clear_and_remove_all_write_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.json")
    for target in (A, B, ODD):
        journal.add(target, "x")
    writes = journal.writes
    assert journal.remove_all([A, B, FreezeTarget("v2", "/never")]) == 2
    assert journal.writes == writes + 1
    assert journal.clear() == 1
    assert journal.entries() == () and Journal(tmp_path / "journal.json").entries() == ()
    assert journal.clear() == 0 and journal.writes == writes + 2
