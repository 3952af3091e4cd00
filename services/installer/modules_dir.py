"""The modules directory as a loader sees it, and the atomic moves that change it.

A module is installed when a directory named as a module id holds ``module.json``. Scratch
directories (``.install-<id>-*``), set-aside old versions (``<id>.replaced-*``) and
directories without ``module.json`` are not modules. A new version is unpacked into a
scratch directory beside the modules and swapped in with one atomic exchange of the two
paths (Linux ``renameat2(RENAME_EXCHANGE)``; two renames where that is not supported), so
a loader sees the old version or the new one, never neither.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.contracts.ids import is_module_id

SCRATCH_PREFIX = ".install-"
"""Start of a scratch directory's name; never a module (a module id has no dot)."""

REPLACED_MARK = ".replaced-"
"""Between the module id and a random tail in a set-aside directory's name."""

_RENAME_EXCHANGE = 2
"""renameat2's flag that swaps two paths (linux/fs.h)."""

_AT_FDCWD = -100
"""renameat2's "relative to the working directory" (fcntl.h)."""

_libc = ctypes.CDLL(None, use_errno=True)
"""The C library, for renameat2 (Python has no binding for it)."""


@dataclass(frozen=True)
class InstalledModule:
    """A module a loader would load: its id and the version its ``module.json`` gives."""

    id: str
    version: str | None

    def describe(self) -> str:
        """``id version`` for messages."""
        return f"{self.id} {self.version}" if self.version else self.id


def installed(modules_dir: Path) -> list[InstalledModule]:
    """Every module in ``modules_dir``, sorted by id (normally none or one)."""
    found: list[InstalledModule] = []
    if not modules_dir.is_dir():
        return found
    for entry in sorted(modules_dir.iterdir()):
        if not is_module_id(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        module_json = entry / "module.json"
        if not module_json.is_file():
            continue
        try:
            version = json.loads(module_json.read_text()).get("version")
        except (OSError, ValueError, AttributeError):
            version = None
        found.append(InstalledModule(entry.name, version if isinstance(version, str) else None))
    return found


def make_scratch(modules_dir: Path, module_id: str) -> Path:
    """A new, empty scratch directory beside the modules (same filesystem, so renames are atomic)."""
    modules_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{module_id}-", dir=modules_dir))


def _exchange(a: Path, b: Path) -> None:
    """Swap the two paths in one step, or raise ``OSError`` (e.g. ENOSYS, EINVAL) if unsupported."""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _set_aside_name(modules_dir: Path, module_id: str) -> Path:
    return modules_dir / f"{module_id}{REPLACED_MARK}{uuid.uuid4().hex[:12]}"


def swap_in(new_dir: Path, modules_dir: Path, module_id: str) -> None:
    """Make ``new_dir`` the module ``module_id``; the old version, if any, is set aside as
    ``<id>.replaced-*`` and removed. If the swap fails, the old version stays in place."""
    target = modules_dir / module_id
    if not target.exists() and not target.is_symlink():
        os.rename(new_dir, target)
        return
    aside = _set_aside_name(modules_dir, module_id)
    try:
        _exchange(new_dir, target)
        os.rename(new_dir, aside)  # new_dir now holds the old version
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
        os.rename(target, aside)
        try:
            os.rename(new_dir, target)
        except OSError:
            os.rename(aside, target)
            raise
    remove_tree(aside)


def set_aside(modules_dir: Path, module_id: str) -> None:
    """Remove the module: one rename takes it out of the loader's sight, then it is deleted."""
    aside = _set_aside_name(modules_dir, module_id)
    os.rename(modules_dir / module_id, aside)
    remove_tree(aside)


def remove_tree(path: Path) -> None:
    """Delete ``path`` (a directory tree, a file or a symlink) without following symlinks."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path)


def leftovers(modules_dir: Path) -> list[Path]:
    """Scratch and set-aside directories an interrupted install or removal left behind."""
    if not modules_dir.is_dir():
        return []
    return [entry for entry in sorted(modules_dir.iterdir())
            if entry.name.startswith(SCRATCH_PREFIX) or REPLACED_MARK in entry.name]
