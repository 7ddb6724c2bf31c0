"""Run directories that cannot be clobbered: a lock per run, no silent reuse, no stale temporary files.

A run takes the directory's lock file by exclusive creation (it names the owner's host and pid), so
a second run on the same directory fails at once. A directory that already holds a run is reused
only to resume it in place or when the user asks to overwrite it. Temporary files that a killed run
left behind (atomic writes in progress) are removed once the lock is held.
"""

from __future__ import annotations

import datetime
import glob
import os
import socket
from dataclasses import dataclass, field
from typing import List, Optional

from psframework.errors import ConfigError

LOCK_NAME = ".psf-lock"
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.jsonl.partial", "summary.json", "checkpoint.pt")


class RunDirError(ConfigError):
    """A run directory is in use, holds another run, or cannot be made."""


@dataclass
class RunDirectory:
    """A run directory this process holds the lock of."""

    path: str
    created: List[str] = field(default_factory=list)  # directories made for this run, outermost first

    @property
    def lock_path(self) -> str:
        return os.path.join(self.path, LOCK_NAME)

    def release(self, remove_if_unused: bool = False) -> None:
        """Drop the lock; with `remove_if_unused`, also remove the directories this run made if still empty."""
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            pass
        if remove_if_unused:
            self.remove_created()

    def remove_created(self) -> None:
        """Remove the directories this run made, innermost first, while they are empty."""
        for directory in reversed(self.created):
            try:
                os.rmdir(directory)
            except OSError:
                break


def run_files(path: str) -> List[str]:
    """Return the names of the run outputs a directory holds."""
    if not os.path.isdir(path):
        return []
    names = set(os.listdir(path))
    found = [name for name in RUN_FILES if name in names]
    return found + sorted(n for n in names if n.startswith("checkpoint-") and n.endswith(".pt"))


def open_run_directory(path: str, resume_in_place: bool = False, overwrite: bool = False) -> RunDirectory:
    """Make and lock a run directory; refuse one in use or holding a run that is neither resumed nor overwritten."""
    run = RunDirectory(path, make_directories(path))
    try:
        take_lock(run)
    except BaseException:
        run.remove_created()
        raise
    try:
        existing = run_files(path)
        if existing and not resume_in_place:
            if not overwrite:
                raise RunDirError(f"output: run directory {path!r} already holds {describe_run(path, existing)}; "
                                  "set output.overwrite=true to replace it, resume it with "
                                  f"train.resume={os.path.join(path, 'checkpoint.pt')}, or choose another name")
            for name in existing:
                os.unlink(os.path.join(path, name))
        remove_stale_temporaries(path)
    except BaseException:
        run.release(remove_if_unused=True)
        raise
    return run


def make_directories(path: str) -> List[str]:
    """Create `path` and its missing parents; return those created, outermost first."""
    missing = []
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        if os.path.exists(probe):
            raise RunDirError(f"output.dir: {probe!r} is a file, expected a directory")
        missing.append(probe)
        probe = os.path.dirname(probe)
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            continue  # another run made it in the meantime: not ours to remove
        except OSError as exc:
            raise RunDirError(f"output.dir: cannot create {directory!r} ({exc.strerror})") from None
        created.append(directory)
    return created


def take_lock(run: RunDirectory) -> None:
    """Create the lock file exclusively; take over one whose owner on this host is gone."""
    stamp = f"{socket.gethostname()} {os.getpid()} {datetime.datetime.now().isoformat(timespec='seconds')}\n"
    for _ in range(2):
        try:
            fd = os.open(run.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = read_lock(run.lock_path)
            if owner is not None and owner_is_gone(owner):
                os.unlink(run.lock_path)  # a killed run's lock: safe to take over
                continue
            raise RunDirError(f"output: run directory {run.path!r} is in use by {describe_owner(owner)} (lock file "
                              f"{run.lock_path}; remove it only if that run is gone)") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(stamp)
        return
    raise RunDirError(f"output: cannot take the lock {run.lock_path!r}: another run took it at the same moment")


def read_lock(path: str) -> Optional[List[str]]:
    """Return the lock's [host, pid, started], or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            parts = fh.read().split()
    except OSError:
        return None
    return parts if len(parts) >= 2 and parts[1].isdigit() else None


def owner_is_gone(owner: List[str]) -> bool:
    """Return whether the lock's owner was a process on this host that no longer runs."""
    if owner[0] != socket.gethostname():
        return False
    try:
        os.kill(int(owner[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def describe_owner(owner: Optional[List[str]]) -> str:
    """Return who holds a lock, in words."""
    if owner is None:
        return "another run (unreadable lock)"
    since = f" since {owner[2]}" if len(owner) > 2 else ""
    return f"pid {owner[1]} on host {owner[0]}{since}"


def describe_run(path: str, names: List[str]) -> str:
    """Return what kind of run a directory holds, in words."""
    if "summary.json" in names:
        return "a finished run (summary.json)"
    checkpoint = "checkpoint.pt" in names
    return "an unfinished run" + (" with a checkpoint" if checkpoint else f" ({', '.join(names)})")


def remove_stale_temporaries(path: str) -> List[str]:
    """Remove the temporary files of atomic writes a killed run left (.NAME.RANDOM.tmp); return them."""
    stale = glob.glob(os.path.join(glob.escape(path), ".*.tmp"))
    for name in stale:
        try:
            os.unlink(name)
        except OSError:
            pass
    return stale
