"""One writer at a time: a lock file per folder (an experiment's output) or per cache entry.

    with hold(out_dir / LOCK_NAME, what=f"the experiment folder {out_dir}"):
        ...   # a second process on the same folder waits here, told who holds it

The lock is an OS advisory lock (fcntl.flock) on the lock file, so it ends with the process that
holds it, however that process ends: no stale locks to clean up. The file records who holds it
(pid, host, command, since when), which is what a waiting or refused run is told. A process
that already holds a lock may take it again (nested runs of one experiment). Where fcntl does
not exist (Windows) nothing is locked; the atomic writes (`cache.write_atomic`) still keep every
file whole.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from timerome.common.progress import notify
from timerome.errors import TimeromeError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".timerome.lock"
# the lock paths this context (thread / task) holds, once per nested hold: a nested hold of the same path
# passes (flock would wait for itself); another thread locks the file like another process
HELD: ContextVar[tuple[str, ...]] = ContextVar("timerome_locks", default=())


def holder(path) -> str:
    """Who holds (or last held) the lock at `path`, in words."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} since {since} ({info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def hold(path, *, wait: bool | float = True, what: str = "this folder", say=None, remove: bool = False):
    """Hold the lock at `path` for the block.

    wait: True waits as long as it takes, a number waits that many seconds, False not at all; a
    run that does not get the lock raises a TimeromeError naming the holder. say(message) is
    told once when the lock is busy and this run waits (default: progress.notify). remove: delete
    the lock file when done (a lock beside a user's file leaves nothing behind); a waiter that got
    the deleted file's lock sees the path no longer is that file and locks the path anew.
    """
    path = Path(path)
    key = str(path.resolve())
    if fcntl is None or key in HELD.get():
        token = HELD.set(HELD.get() + (key,))
        try:
            yield
        finally:
            HELD.reset(token)
        return
    say = say or notify
    while True:
        # at every try: the holder waited for may have removed the folder with its lock file (an
        # experiment run that kept nothing, `Runner.lock`)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _acquire(fd, path, wait, what, say)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed the file as we waited for it: lock the path's new file
        say = _quiet
    try:
        token = HELD.set(HELD.get() + (key,))
        try:
            _record(fd)  # inside: a full disk failing this write still removes (remove=True) and unlocks the file
            yield
        finally:
            HELD.reset(token)
            if remove:
                path.unlink(missing_ok=True)  # still held: a waiter on this file then finds the path changed
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _quiet(message: str) -> None:
    pass


def _acquire(fd: int, path: Path, wait, what: str, say) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    who = holder(path)
    if wait is False:
        raise TimeromeError(f"{what} is in use by {who}; wait for it to finish or choose another folder")
    limit = None if wait is True else float(wait)
    say(f"{what} is in use by {who}; waiting for it to finish (Ctrl-C to stop)")
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if limit is not None and time.monotonic() - t0 >= limit:
                raise TimeromeError(f"{what} is still in use by {holder(path)} after {limit:g} s of waiting; "
                                    "try again later or choose another folder") from None
            time.sleep(0.2)


def _record(fd: int) -> None:
    info = dict(pid=os.getpid(), host=socket.gethostname(), since=time.time(),
                command=" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200])
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
