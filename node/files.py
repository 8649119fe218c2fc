"""The files of a node home as this process's user may use them, and the one line an operator gets when one is
wrong: the file, what is wrong (its owner and mode, a directory that cannot be entered, a read-only
filesystem) and the command that fixes it.

``check(home, files)`` runs before a process opens anything in the home, so a home it cannot use is refused
before any file is created there; ``explain(exc, home)`` turns a permission error met later into the same line.
A missing file is not a problem here: whoever reads it says what to do (``identity generate``, ``mesh cert
issue``). Stdlib only, besides the room's error.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from node.errors import ServiceCode, ServiceError


class Need(StrEnum):
    """What a process does with a path of its home."""

    ENTER = "enter"    # a directory only passed through (the home itself)
    READ = "read"      # a file read (a key, a certificate, hooks.toml); when absent, its reader says so
    WRITE = "write"    # a file read and written in place (the database and its -wal and -shm)
    LIST = "list"      # a directory whose files are listed and each read (keys/, peers/)
    CREATE = "create"  # a directory files are created in, made with its parents when absent (data/, run/)


# The access each need asks of the path itself (os.access bits), and how a message says it.
_BITS = {Need.ENTER: os.X_OK, Need.READ: os.R_OK, Need.WRITE: os.R_OK | os.W_OK, Need.LIST: os.R_OK | os.X_OK,
         Need.CREATE: os.W_OK | os.X_OK}
_CHMOD = {Need.ENTER: "x", Need.READ: "r", Need.WRITE: "rw", Need.LIST: "rx", Need.CREATE: "wx"}
_DONE = {Need.ENTER: "entered", Need.READ: "read", Need.WRITE: "written", Need.LIST: "read",
         Need.CREATE: "written (files are created in it)"}


@dataclass(frozen=True, slots=True)
class HomeFile:
    """One path a process uses: where, what it is (for the message: "the node's private key") and its need."""

    path: Path
    what: str
    need: Need


def check(home: Path, files: Iterable[HomeFile]) -> None:
    """Raise the first problem of ``files`` (a ServiceError naming the file, what is wrong and the fix)."""
    for f in files:
        err = problem(f, home)
        if err is not None:
            raise err


def problem(f: HomeFile, home: Path) -> ServiceError | None:
    """What keeps this process's user from ``f.need`` on ``f.path``, as the error to raise; None when nothing does."""
    path = Path(os.path.abspath(f.path))
    blocked = _unenterable_ancestor(path)
    if blocked is not None:
        return _refused(f, blocked, Need.ENTER, home)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _creatable(f, path, home) if f.need is Need.CREATE else None
    except OSError as e:
        return _refused(f, path, f.need, home, detail=e.strerror)
    is_dir = stat.S_ISDIR(st.st_mode)
    if is_dir != (f.need in (Need.ENTER, Need.LIST, Need.CREATE)):
        kind = "a directory" if is_dir else "not a directory"
        return ServiceError(ServiceCode.FILE_UNREADABLE, f"{f.what} {path} is {kind}; move it away or fix the "
                                                         "setting that names it")
    if not os.access(path, _BITS[f.need], effective_ids=True):
        return _refused(f, path, f.need, home)
    if f.need in (Need.WRITE, Need.CREATE) and _read_only_fs(path):
        return _read_only(f, path)
    if f.need is Need.LIST:
        return _unreadable_entry(f, path, home)
    return None


def explain(exc: OSError, home: Path | None, what: str = "the file") -> ServiceError | None:
    """The one-line error for a permission error (EACCES, EPERM, EROFS) naming a file (``what`` it is); None for
    any other."""
    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not exc.filename:
        return None
    path = Path(os.path.abspath(os.fsdecode(exc.filename)))
    home = home or path.parent
    if exc.errno == errno.EROFS:
        return _read_only(HomeFile(path, what, Need.WRITE), path)
    blocked = _unenterable_ancestor(path)
    if blocked is not None:
        return _refused(HomeFile(path, what, Need.READ), blocked, Need.ENTER, home)
    if os.path.lexists(path):
        need = Need.LIST if path.is_dir() else Need.READ if not os.access(path, os.R_OK) else Need.WRITE
        f = HomeFile(path, "the directory" if need is Need.LIST else what, need)
    else:
        f = HomeFile(path.parent, "the directory", Need.CREATE)
    return problem(f, home) or _refused(f, f.path, f.need, home, detail=exc.strerror)


# ---- what is wrong ----------------------------------------------------------------------------

def _unenterable_ancestor(path: Path) -> Path | None:
    """The first directory on the way to ``path`` (from the root) this user may not pass through."""
    for d in reversed(path.parents):
        if os.path.isdir(d) and not os.access(d, os.X_OK, effective_ids=True):
            return d
    return None


def _creatable(f: HomeFile, path: Path, home: Path) -> ServiceError | None:
    """``path`` is absent: the nearest directory above it that exists must take new entries."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK, effective_ids=True):
        return _refused(f, parent, Need.CREATE, home)
    if _read_only_fs(parent):
        return _read_only(f, parent)
    return None


def _unreadable_entry(f: HomeFile, directory: Path, home: Path) -> ServiceError | None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as e:
        return _refused(f, directory, Need.LIST, home, detail=e.strerror)
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file(follow_symlinks=True):
            continue
        if not os.access(entry.path, os.R_OK, effective_ids=True):
            return _refused(HomeFile(Path(entry.path), f"a file of {f.what}", Need.READ), Path(entry.path),
                            Need.READ, home)
    return None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


# ---- the line ---------------------------------------------------------------------------------

def user() -> str:
    """This process's effective user, by name where it has one."""
    return _user_name(os.geteuid())


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry (a container's): chown takes the number
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _owner(path: Path) -> tuple[str, int, int] | None:
    """("user:group", uid, mode) of ``path``; None when it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{_user_name(st.st_uid)}:{_group_name(st.st_gid)}", st.st_uid, stat.S_IMODE(st.st_mode)


def fix(blocker: Path, need: Need, home: Path) -> str:
    """The command that gives this user ``need`` on ``blocker``: the home handed to the user whose it should be
    (``chown -R``), a directory above the home opened for passing through, or a mode bit for the owner."""
    me, group = user(), _group_name(os.getegid())
    seen = _owner(blocker)
    q = shlex.quote
    if seen is not None and seen[1] == os.geteuid():
        return f"chmod u+{_CHMOD[need]} {q(str(blocker))}"
    if blocker == home or home in blocker.parents:
        return f"chown -R {me}:{group} {q(str(home))}"
    if blocker in home.parents:
        return f"chmod o+x {q(str(blocker))}"
    return f"chown {me}:{group} {q(str(blocker))}"


def _refused(f: HomeFile, blocker: Path, need: Need, home: Path, *, detail: str | None = None) -> ServiceError:
    code = ServiceCode.FILE_UNWRITABLE if need in (Need.WRITE, Need.CREATE) else ServiceCode.FILE_UNREADABLE
    seen = _owner(blocker)
    facts = f"owned by {seen[0]}, mode {seen[2]:04o}" if seen is not None else (detail or "cannot be looked at")
    if blocker == Path(os.path.abspath(f.path)):
        head = f"{f.what} {blocker} cannot be {_DONE[need]} by user {user()} ({facts})"
    else:
        head = (f"{f.what} {f.path} cannot be {_DONE[f.need]} by user {user()}: the directory {blocker} cannot be "
                f"{_DONE[need]} ({facts})")
    return ServiceError(code, f"{head}; run: {fix(blocker, need, home)}")


def _read_only(f: HomeFile, where: Path) -> ServiceError:
    return ServiceError(ServiceCode.FILE_UNWRITABLE,
                        f"{f.what} {f.path} cannot be written: {where} is on a read-only filesystem; mount it "
                        f"read-write (under systemd's ProtectSystem=strict: add it to ReadWritePaths=)")


def socket_refused(path: Path) -> ServiceError:
    """A node's local socket this user may not connect to: the socket is its owner's (mode 0600), so the fix is to
    run as that user, not to hand the node's files to this one."""
    seen = _owner(path)
    owner = seen[0].partition(":")[0] if seen is not None else "the node's user"
    facts = f"owned by {seen[0]}, mode {seen[2]:04o}" if seen is not None else "its directory cannot be entered"
    return ServiceError(ServiceCode.FILE_UNREADABLE,
                        f"the node's local socket {path} cannot be opened by user {user()} ({facts}); run this "
                        f"command as the node's user: sudo -u {owner} ai-memory ...")
