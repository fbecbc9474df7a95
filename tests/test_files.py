"""Files are never lost or left broken: atomic writes, exclusive creates, the ledger's lock.

The fault tests run a real writer in a subprocess and hurt it the way a user's machine
can: SIGKILL in the middle of a write (paused deterministically just before the data
reaches the disk), a full disk (a file-size limit, ``RLIMIT_FSIZE``), and several
processes adding ledger entries at once. Each must leave a file that loads and holds
every committed entry.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from workbench import files
from workbench.waits import ledger as wait_ledger

ROOT = Path(__file__).resolve().parent.parent


def _entry(i: int | str, **kw) -> dict:
    return {
        "id": f"test-{i}",
        "kind": "published",
        "ms": 0.1,
        "device": "d",
        "backend": "cpu",
        "method": "m",
        "source": "s",
        **kw,
    }


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "wait_prices.json"
    shutil.copy(wait_ledger.LEDGER_PATH, path)
    return path


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- the primitives ---------------------------------------------------------------------


def test_write_atomic_creates_replaces_and_refuses(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "r.json"
    files.write_atomic(path, "one")
    assert path.read_text() == "one"
    files.write_atomic(path, b"two")
    assert path.read_text() == "two"
    with pytest.raises(files.RecordExists, match="exists"):
        files.write_atomic(path, "three", overwrite=False)
    with pytest.raises(ValueError, match="path: .*r.json exists"):  # a ValueError for callers that catch those
        files.write_atomic(path, "three", overwrite=False)
    assert path.read_text() == "two"
    files.write_atomic(tmp_path / "sub" / "new.json", "x", overwrite=False)
    assert _leftovers(tmp_path / "sub") == []
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(path, "new" * 1000)
    assert path.read_text() == "old" and _leftovers(tmp_path) == []


def test_write_json_refuses_nan(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        files.write_json(tmp_path / "r.json", {"ms": float("nan")})
    assert not (tmp_path / "r.json").exists() and _leftovers(tmp_path) == []


def test_update_json_is_read_modify_write(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    files.write_json(path, {"n": 1})
    assert files.update_json(path, lambda d: {**d, "n": d["n"] + 1}) == {"n": 2}
    with pytest.raises(KeyError):  # a change that fails leaves the file as it was
        files.update_json(path, lambda d: d["nope"])
    assert json.loads(path.read_text()) == {"n": 2}
    path.write_text("")  # what a truncating write killed midway used to leave
    with pytest.raises(ValueError, match="not valid JSON"):
        files.update_json(path, lambda d: d)
    with pytest.raises(ValueError, match="does not exist"):
        files.update_json(tmp_path / "none.json", lambda d: d)
    assert files.lock_path(path).name == ".l.json.lock"


def test_a_held_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    files.write_json(path, {})
    with files.locked(path):
        # filelock's locks are per process and re-entrant within it: a child must contend.
        code = (
            f"from workbench import files\n"
            f"try:\n    files.update_json({str(path)!r}, lambda d: d, timeout=0.2)\n"
            f"except ValueError as e:\n    print(e)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "is locked by another process" in done.stdout, done.stderr


# -- faults, in real processes ----------------------------------------------------------

#: A child that adds one ledger entry but stops, before the data is synced, where a kill
#: does the most harm, and says so on stdout; the parent then kills it.
_PAUSED_WRITER = textwrap.dedent("""
    import os, sys, time
    from workbench.waits import ledger as wait_ledger
    real_fsync = os.fsync
    def pause(fd):
        print("paused", flush=True)
        time.sleep(600)
    os.fsync = pause
    wait_ledger.add_price({"id": "killed", "kind": "published", "ms": 0.3, "device": "d", "backend": "cpu",
                           "method": "m" * 200_000, "source": "s"}, sys.argv[1])
""")


def test_a_writer_killed_mid_write_leaves_the_old_ledger(ledger: Path) -> None:
    before = ledger.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_WRITER, str(ledger)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "paused", child.stderr.read()
        # The new content is in a temporary file now, half a megabyte, not yet synced.
        assert any(n.startswith(".wait_prices.json.") for n in _leftovers(ledger.parent))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert ledger.read_bytes() == before
    assert [e["id"] for e in wait_ledger.load_ledger(ledger)] == [e["id"] for e in wait_ledger.load_ledger()]
    # The lock died with the writer: the next add goes through at once, and the killed
    # writer's temporary file (left by the kill, ignored by git) does not disturb it.
    wait_ledger.add_price(_entry("after"), ledger)
    assert wait_ledger.ledger_price("test-after", ledger) == 0.1


_FULL_DISK_WRITER = textwrap.dedent("""
    import resource, signal, sys
    from workbench.waits import ledger as wait_ledger
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        wait_ledger.add_price({"id": "too-big", "kind": "published", "ms": 0.3, "device": "d", "backend": "cpu",
                               "method": "m" * 100_000, "source": "s"}, sys.argv[1])
    except OSError as e:
        print("refused:", e.errno, flush=True)
        sys.exit(3)
""")


def test_a_full_disk_leaves_the_old_ledger(ledger: Path) -> None:
    before = ledger.read_bytes()
    limit = len(before) + 1000  # room for the old ledger, not for the new one
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_WRITER, str(ledger), str(limit)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "refused: 27" in done.stdout  # EFBIG: the file-size limit, as a full disk would refuse
    assert ledger.read_bytes() == before and _leftovers(ledger.parent) == []
    wait_ledger.load_ledger(ledger)


_ADDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from workbench.waits import ledger as wait_ledger
    ledger, who, n, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    (gate / f"ready-{who}").touch()
    while not (gate / "go").exists():  # start together, so the writers really contend
        time.sleep(0.005)
    for i in range(n):
        wait_ledger.add_price({"id": f"w{who}-{i}", "kind": "published", "ms": 0.01 * (i + 1), "device": "d",
                               "backend": "cpu", "method": "m", "source": who}, ledger)
""")


def test_concurrent_writers_lose_no_entry(ledger: Path, tmp_path: Path) -> None:
    n_writers, n_each = 3, 25
    gate = tmp_path / "gate"
    gate.mkdir()
    base = [e["id"] for e in wait_ledger.load_ledger(ledger)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ADDER, str(ledger), str(w), str(n_each), str(gate)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(n_writers)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(list(gate.glob("ready-*"))) < n_writers:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a writer did not start"
            time.sleep(0.01)
        (gate / "go").touch()
        for p in procs:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    ids = [e["id"] for e in wait_ledger.load_ledger(ledger)]
    expected = {f"w{w}-{i}" for w in range(n_writers) for i in range(n_each)}
    assert ids[: len(base)] == base and set(ids[len(base) :]) == expected and len(ids) == len(base) + len(expected)
    assert _leftovers(ledger.parent) == []


def test_the_file_size_limit_is_available() -> None:
    # The disk-full test depends on it; a platform without it should fail loudly, not skip.
    assert hasattr(resource, "RLIMIT_FSIZE") and hasattr(signal, "SIGXFSZ")


def test_exclusive_create_without_hard_links(tmp_path: Path, monkeypatch) -> None:
    # Some file systems refuse os.link; the exclusive create still holds there.
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "r.json"
    files.write_atomic(path, "one", overwrite=False)
    with pytest.raises(files.RecordExists):
        files.write_atomic(path, "two", overwrite=False)
    assert path.read_text() == "one" and _leftovers(tmp_path) == []


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    path.chmod(0o600)
    files.write_atomic(path, "new")
    assert path.stat().st_mode & 0o777 == 0o600


def test_command_shown_drops_only_the_out_dir():
    from workbench.files import command_shown

    assert (
        command_shown("python -m bench.gpu_check --checks-only --out-dir /root/out/bench")
        == "python -m bench.gpu_check --checks-only"
    )
    assert command_shown("python -m bench.x --out-dir=/tmp/o --rounds 8") == "python -m bench.x --rounds 8"
    assert command_shown("python -m bench.kernel_bench") == "python -m bench.kernel_bench"
    with pytest.raises(ValueError, match="command must be a str"):
        command_shown(None)
