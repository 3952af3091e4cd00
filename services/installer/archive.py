"""Inspecting a module artifact (tar.gz) in full before anything is unpacked, then unpacking it.

The inspection reads the whole archive as a stream and refuses absolute paths, ``..``,
symlinks, hard links, devices, FIFOs and any other special entry, duplicate or clashing
paths, too many entries, and a size bomb: the unpacked bytes are counted as the
decompressor produces them (headers are not trusted), against a total cap and a cap on
the ratio to the compressed bytes read so far. ``module.json`` must be at the root and
name the manifest's module (and version, when it gives one).

The inspection keeps the decompressed tar it read; unpacking reads that file (so exactly
the bytes inspected, and no second decompression) with the same per-entry checks, and
also through tarfile's ``data`` filter: that filter has had bypasses, so it is a second
wall, not the only one.
"""

from __future__ import annotations

import json
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol, cast

from services.installer.refusals import BAD_INPUT, Refused

MODULE_JSON = "module.json"
"""The file at an artifact's root that says which module it is."""

MODULE_JSON_MAX_BYTES = 64 * 1024
"""Largest ``module.json`` read."""

RATIO_SLACK_BYTES = 1024 * 1024
"""Unpacked bytes allowed beyond the ratio cap, so tiny archives (mostly tar padding) pass."""

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip stream."""

GZIP_WBITS = 16 + zlib.MAX_WBITS
"""zlib's setting for a gzip stream (header and trailer checked)."""

MAX_NAME_CHARS = 1024
"""Longest entry path accepted."""

READ_BYTES = 1024 * 1024
"""Read size of file data while inspecting and unpacking."""

STREAM_BUFFER_BYTES = 64 * 1024
"""tarfile's stream buffer: its default 10 kB costs a Python call per 10 kB; much larger
costs a copy of the buffer's rest on every small read (tarfile slices it)."""

_KINDS = {  # entry types refused by name
    tarfile.SYMTYPE: "a symlink", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO",
}


@dataclass(frozen=True)
class Limits:
    """What an artifact may expand to."""

    max_entries: int
    max_unpacked_bytes: int
    max_ratio: float


@dataclass(frozen=True)
class Inspection:
    """What the inspection found in an archive that passed."""

    entries: int
    unpacked_bytes: int
    module_json: dict[str, Any]


class ByteSource(Protocol):
    """What an archive is read from: a file, or the bytes of a download as they arrive."""

    def read(self, size: int = -1, /) -> bytes: ...


class _InflateGuard:
    """The decompressed stream of a gzip file, refusing once it grows past the total or ratio caps.

    zlib is driven directly (``gzip.GzipFile`` adds Python layers per read, measurably slower):
    each call inflates at most ``size`` bytes, so even a bomb never takes more memory than
    one read; the gzip trailer's CRC and length are checked by zlib. With ``keep``, every
    decompressed byte is also written there (the tar that will be unpacked)."""

    def __init__(self, raw: ByteSource, limits: Limits, keep: IO[bytes] | None = None) -> None:
        self._raw, self.limits, self._keep = raw, limits, keep
        head = raw.read(2)
        if head != GZIP_MAGIC:
            raise Refused(BAD_INPUT, "the artifact is not gzip-compressed; a .tar.gz is required")
        self._input, self.compressed, self.count = head, 2, 0
        self._inflater = zlib.decompressobj(wbits=GZIP_WBITS)

    def _more_input(self) -> bytes:
        data = self._raw.read(READ_BYTES)
        self.compressed += len(data)
        return data

    def read(self, size: int = -1) -> bytes:
        size = READ_BYTES if size is None or size < 0 else size
        while True:
            if self._inflater.eof:
                rest = self._inflater.unused_data or self._more_input()
                if not rest.strip(b"\x00"):  # end of file (zero padding is allowed, like gzip does)
                    if rest and not self._drain_padding():
                        raise Refused(BAD_INPUT, "the artifact has data after its gzip stream")
                    return b""
                if not rest.startswith(GZIP_MAGIC[:len(rest)]):
                    raise Refused(BAD_INPUT, "the artifact has data after its gzip stream")
                self._inflater, self._input = zlib.decompressobj(wbits=GZIP_WBITS), rest
            if not self._input:
                self._input = self._inflater.unconsumed_tail or self._more_input()
                if not self._input:
                    raise Refused(BAD_INPUT, "the artifact's gzip stream is broken (it ends too early)")
            try:
                data = self._inflater.decompress(self._input, size)
            except zlib.error as exc:
                raise Refused(BAD_INPUT, f"the artifact's gzip stream is broken ({exc})") from None
            self._input = b""
            if data:
                self._count(len(data))
                if self._keep is not None:
                    self._keep.write(data)
                return data

    def _drain_padding(self) -> bool:
        """True when only zero bytes remain in the file."""
        while chunk := self._more_input():
            if chunk.strip(b"\x00"):
                return False
        return True

    def _count(self, produced: int) -> None:
        self.count += produced
        if self.count > self.limits.max_unpacked_bytes:
            raise Refused(BAD_INPUT, f"the artifact unpacks to more than {self.limits.max_unpacked_bytes} "
                                     "bytes (the unpacked size cap)")
        if self.count > self.limits.max_ratio * self.compressed + RATIO_SLACK_BYTES:
            raise Refused(BAD_INPUT, "the artifact expands more than "
                                     f"{self.limits.max_ratio:g} times its compressed size (a size bomb)")

    def drain(self) -> None:
        """Read to the end, so a truncated or bomb-padded tail is found too."""
        while self.read(READ_BYTES):
            pass

    def close(self) -> None:
        self._inflater = zlib.decompressobj(wbits=GZIP_WBITS)


def entry_path(member: tarfile.TarInfo) -> str:
    """The entry's path, normalised (no ``./``, no trailing ``/``), or :class:`Refused` saying why
    the entry may not be unpacked."""
    name = member.name
    if len(name) > MAX_NAME_CHARS or "\x00" in name or "\\" in name:
        raise Refused(BAD_INPUT, f"the artifact has an entry with an unusable name ({name[:80]!r})")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise Refused(BAD_INPUT, f"the artifact has an absolute path: {name!r}")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise Refused(BAD_INPUT, f"the artifact has a path with '..': {name!r}")
    if not parts:
        if member.isdir():
            return ""
        raise Refused(BAD_INPUT, f"the artifact has an entry with an empty name ({name!r})")
    if member.type in _KINDS:
        raise Refused(BAD_INPUT, f"the artifact has {_KINDS[member.type]}: {name!r}; links and special "
                                 "files are not allowed")
    if not (member.isreg() or member.isdir()) or member.issparse():
        raise Refused(BAD_INPUT, f"the artifact has an unsupported entry type {member.type!r}: {name!r}")
    return "/".join(parts)


class _Layout:
    """The paths seen so far, to refuse duplicates and a file used as a directory."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = {""}

    def add(self, path: str, is_dir: bool) -> None:
        for parent in PurePosixPath(path).parents:
            name = "" if str(parent) == "." else str(parent)
            if name in self.files:
                raise Refused(BAD_INPUT, f"the artifact uses the file {name!r} as a directory")
            self.dirs.add(name)
        if path in self.files:
            raise Refused(BAD_INPUT, f"the artifact holds {path!r} more than once")
        if is_dir:
            self.dirs.add(path)
        elif path in self.dirs:
            raise Refused(BAD_INPUT, f"the artifact holds {path!r} as both a file and a directory")
        else:
            self.files.add(path)


class _TarFile(tarfile.TarFile):
    """A TarFile whose file data moves in large reads (:data:`READ_BYTES`), not tarfile's 16 kB."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("copybufsize", READ_BYTES)
        super().__init__(*args, **kwargs)


def _open_tar(guard: _InflateGuard) -> tarfile.TarFile:
    # A stream ("r|") reads its file object front to back and never writes, tells or seeks: the
    # guard's read() is all it uses (typeshed's _Fileobj also names write, tell and seek).
    fileobj = cast(IO[bytes], guard)
    try:
        return _TarFile.open(fileobj=fileobj, mode="r|", bufsize=STREAM_BUFFER_BYTES)
    except tarfile.ReadError as exc:
        raise Refused(BAD_INPUT, f"the artifact is not a tar archive inside its gzip ({exc})") from None


def _members(tar: tarfile.TarFile, limits: Limits) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Each entry with its checked path; refuses the whole archive at the first bad one."""
    layout, count = _Layout(), 0
    try:
        for member in tar:
            count += 1
            if count > limits.max_entries:
                raise Refused(BAD_INPUT, f"the artifact has more than {limits.max_entries} entries")
            path = entry_path(member)
            if path:
                layout.add(path, member.isdir())
            yield member, path
    except tarfile.TarError as exc:
        raise Refused(BAD_INPUT, f"the artifact's tar stream is broken ({exc})") from None


def _read_module_json(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused(BAD_INPUT, f"the artifact's module.json is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise Refused(BAD_INPUT, "the artifact's module.json is not a JSON object")
    return parsed


def inspect(path: Path, module_id: str, version: str, limits: Limits, keep_tar: Path | None = None) -> Inspection:
    """Read the whole archive at ``path`` and return what it holds, or :class:`Refused` (400).
    With ``keep_tar``, the decompressed tar is written there, for :func:`unpack`."""
    with open(path, "rb") as raw:
        if keep_tar is None:
            return inspect_stream(raw, module_id, version, limits)
        with open(keep_tar, "wb") as keep:
            return inspect_stream(raw, module_id, version, limits, keep)


def inspect_stream(raw: ByteSource, module_id: str, version: str, limits: Limits,
                   keep: IO[bytes] | None = None) -> Inspection:
    """:func:`inspect` on a stream of the archive's bytes (e.g. as it downloads), writing the
    decompressed tar to ``keep`` if given."""
    guard = _InflateGuard(raw, limits, keep)
    module_json: dict[str, Any] | None = None
    entries = 0
    try:
        tar = _open_tar(guard)
        for member, name in _members(tar, limits):
            entries += 1
            if not member.isreg():
                continue
            reader = tar.extractfile(member)
            assert reader is not None  # a regular file always has one
            if name == MODULE_JSON:
                if member.size > MODULE_JSON_MAX_BYTES:
                    raise Refused(BAD_INPUT, f"the artifact's module.json is over {MODULE_JSON_MAX_BYTES} bytes")
                module_json = _read_module_json(reader.read())
            else:
                while reader.read(READ_BYTES):
                    pass
        guard.drain()
    finally:
        guard.close()
    if module_json is None:
        raise Refused(BAD_INPUT, "the artifact has no module.json at its root")
    named = module_json.get("id")
    if named != module_id:
        raise Refused(BAD_INPUT, f"the artifact's module.json names module {named!r}, but the manifest "
                                 f"is for {module_id!r}")
    if "version" in module_json and module_json["version"] != version:
        raise Refused(BAD_INPUT, f"the artifact's module.json says version {module_json['version']!r}, "
                                 f"but the manifest says {version!r}")
    return Inspection(entries=entries, unpacked_bytes=guard.count, module_json=module_json)


def unpack(tar_path: Path, dest: Path, limits: Limits) -> None:
    """Unpack the decompressed tar an inspection kept (so exactly the bytes inspected) into the
    empty directory ``dest``, checking every entry again and through tarfile's ``data`` filter."""
    try:
        tar = _TarFile.open(tar_path, mode="r:")
    except tarfile.ReadError as exc:
        raise Refused(BAD_INPUT, f"the artifact is not a tar archive ({exc})") from None
    with tar:
        checked = (member for member, name in _members(tar, limits) if name)
        try:
            tar.extractall(dest, members=checked, filter="data")
        except tarfile.FilterError as exc:
            raise Refused(BAD_INPUT, f"the artifact was refused while unpacking ({exc})") from None
