"""Where input files live: local disk or object storage, listed safely and opened as decompressed streams.

Paths are local paths or URIs (``s3://bucket/prefix/*.jsonl.zst``, ``gs://…``, ``hdfs://…``; any other scheme
through fsspec).  A pattern is split into a *root* (the part before the first glob character, or the folder given)
and a glob below it; each file gets ``rel``, its path relative to that root, which is what document ids hash, so
the same data gives the same ids wherever it is mounted.

Local listing is our own walk rather than :func:`glob.glob`: it follows symlinked folders but remembers every
folder's (device, inode), so a symlink cycle becomes a ``symlink_loop`` rejection instead of an endless walk, and
unreadable folders, broken links and looping file links are reported, not skipped.  Those problems travel in the
plan as units of their own, so they are counted in a shard's stats like any bad document.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.ingest.readers.base import FileRef, ReadError

GLOB_CHARS = "*?["
_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd")


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def compression_of(name: str) -> str:
    low = name.lower()
    for suffix in _COMPRESSED:
        if low.endswith(suffix):
            return suffix.lstrip(".").replace("zstd", "zst")
    return ""


def strip_compression(name: str) -> str:
    c = compression_of(name)
    return name[: -len(c) - 1] if c else name


def glob_regex(pattern: str) -> re.Pattern:
    """Translate a relative glob (``**/`` spans folders, ``*`` and ``?`` stay inside one) into a regex."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape("["))
                i += 1
            else:
                body = pattern[i + 1:j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def split_pattern(pattern: str) -> tuple[str, str]:
    """(root, glob below it); glob is "" when the pattern names one file or folder."""
    parts = pattern.split("/")
    for k, part in enumerate(parts):
        if any(ch in part for ch in GLOB_CHARS):
            return "/".join(parts[:k]) or "/", "/".join(parts[k:])
    return pattern, ""


@dataclass(slots=True)
class Problem:
    """A path that cannot be read, found while listing; it becomes a rejection in the shard that holds it."""

    path: str
    rel: str
    reason: str
    detail: str


def _oserror_reason(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "unreadable_file"
    if exc.errno == errno.ELOOP:
        return "symlink_loop"
    if isinstance(exc, FileNotFoundError):
        return "missing_path"
    return "unreadable_file"


class Storage:
    """Lists and opens files of one source; local paths use the OS directly, URIs a pyarrow filesystem."""

    def __init__(self, fs_options: dict | None = None):
        self.fs_options = dict(fs_options or {})
        self._fs: dict[str, object] = {}

    # -- filesystem for a URI ----------------------------------------------------------------------------------
    def filesystem(self, uri: str) -> tuple[object, str]:
        """(pyarrow FileSystem, path inside it) for a URI; cached per scheme."""
        import pyarrow.fs as pafs

        scheme, rest = uri.split("://", 1)
        if scheme not in self._fs:
            if scheme == "s3" and self.fs_options:
                self._fs[scheme] = pafs.S3FileSystem(**self.fs_options)
            elif scheme in ("gs", "gcs") and self.fs_options:
                self._fs[scheme] = pafs.GcsFileSystem(**self.fs_options)
            elif scheme in ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss"):
                self._fs[scheme] = pafs.FileSystem.from_uri(uri)[0]
            else:
                import fsspec

                self._fs[scheme] = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme, **self.fs_options)))
        fs = self._fs[scheme]
        if isinstance(fs, pafs.PyFileSystem):
            return fs, uri
        return fs, rest

    # -- listing -------------------------------------------------------------------------------------------------
    def list(self, pattern: str) -> tuple[list[FileRef], list[Problem]]:
        """Every file the pattern names (sorted by ``rel``) and the problems met on the way."""
        root, glob = split_pattern(pattern)
        if is_uri(pattern):
            files, problems = self._list_remote(pattern, root, glob)
        else:
            if pattern.startswith("file://"):
                root = root[len("file://"):]
            files, problems = self._list_local(pattern, root, glob)
        files.sort(key=lambda f: f.rel)
        return files, problems

    def _list_local(self, pattern: str, root: str, glob: str) -> tuple[list[FileRef], list[Problem]]:
        name = os.path.basename(root.rstrip("/")) or root
        try:
            st = os.stat(root)
        except OSError as exc:
            reason = _oserror_reason(exc)
            detail = {"missing_path": "no such file or folder", "symlink_loop": "symbolic link loop",
                      "unreadable_file": f"cannot be accessed ({exc.strerror})"}[reason]
            if reason == "missing_path" and os.path.islink(root):
                detail = f"broken symbolic link to {os.readlink(root)!r}"
            return [], [Problem(pattern, name, reason, detail)]
        if not stat.S_ISDIR(st.st_mode):
            if glob:
                return [], [Problem(pattern, name, "missing_path", "the part before the glob is not a folder")]
            return [FileRef(root, name, st.st_size)], []
        files, problems = self._walk(root)
        if glob:
            rx = glob_regex(glob)
            files = [f for f in files if rx.match(f.rel)]
            problems = [p for p in problems if rx.match(p.rel) or p.reason != "missing_path"]
            if not files and not problems:
                problems.append(Problem(pattern, glob, "missing_path", "no file matches this pattern"))
        elif not files and not problems:
            problems.append(Problem(pattern, name, "empty_file", "folder holds no files"))
        return files, problems

    @staticmethod
    def _walk(root: str) -> tuple[list[FileRef], list[Problem]]:
        files: list[FileRef] = []
        problems: list[Problem] = []
        st = os.stat(root)
        stack = [(root, "", ((st.st_dev, st.st_ino),))]
        while stack:
            folder, prefix, ancestors = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                problems.append(Problem(folder, prefix.rstrip("/") or ".", _oserror_reason(exc),
                                        f"folder cannot be listed ({exc.strerror})"))
                continue
            for entry in entries:
                rel = prefix + entry.name
                try:
                    est = entry.stat(follow_symlinks=True)
                except OSError as exc:
                    reason = _oserror_reason(exc)
                    detail = "symbolic link loop" if reason == "symlink_loop" else (
                        f"broken symbolic link to {os.readlink(entry.path)!r}" if entry.is_symlink()
                        else f"cannot be accessed ({exc.strerror})")
                    problems.append(Problem(entry.path, rel, reason, detail))
                    continue
                if stat.S_ISDIR(est.st_mode):
                    key = (est.st_dev, est.st_ino)
                    if key in ancestors:
                        problems.append(Problem(entry.path, rel, "symlink_loop",
                                                "symbolic link back to an enclosing folder "
                                                f"({os.readlink(entry.path)!r})"
                                                if entry.is_symlink() else "folder cycle"))
                        continue
                    stack.append((entry.path, rel + "/", ancestors + (key,)))
                elif stat.S_ISREG(est.st_mode):
                    files.append(FileRef(entry.path, rel, est.st_size))
                else:
                    problems.append(Problem(entry.path, rel, "unreadable_file",
                                            "not a regular file (device, fifo or socket)"))
        return files, problems

    def _list_remote(self, pattern: str, root: str, glob: str) -> tuple[list[FileRef], list[Problem]]:
        import pyarrow.fs as pafs

        fs, path = self.filesystem(root)
        name = path.rstrip("/").rsplit("/", 1)[-1]
        try:
            info = fs.get_file_info(path)
        except OSError as exc:
            return [], [Problem(pattern, name, "unreadable_file", f"cannot be listed ({exc})")]
        if info.type == pafs.FileType.NotFound:
            return [], [Problem(pattern, name, "missing_path", "no such object or prefix")]
        if info.type == pafs.FileType.File and not glob:
            return [FileRef(root, name, info.size or 0)], []
        base = path.rstrip("/") + "/"
        prefix = root.rstrip("/") + "/"
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = [FileRef(prefix + i.path[len(base):] if i.path.startswith(base) else i.path,
                         i.path[len(base):] if i.path.startswith(base) else i.base_name, i.size or 0)
                 for i in infos if i.type == pafs.FileType.File]
        if glob:
            rx = glob_regex(glob)
            files = [f for f in files if rx.match(f.rel)]
        if not files:
            return [], [Problem(pattern, glob or name, "missing_path", "no object matches this pattern")]
        return files, []

    # -- opening -------------------------------------------------------------------------------------------------
    def open_raw(self, path: str):
        """A binary stream of the file as stored (no decompression); errors become :class:`ReadError`."""
        try:
            if is_uri(path):
                fs, inner = self.filesystem(path)
                return fs.open_input_stream(inner, compression=None)
            return open(path.removeprefix("file://"), "rb", buffering=1 << 20)
        except OSError as exc:
            raise ReadError(_oserror_reason(exc), f"cannot be opened ({exc.strerror or exc})") from None

    def open_random_access(self, path: str, buffered: bool = True):
        """A seekable file.  Buffered (JSONL byte ranges: ``readline``), or with ``buffered=False`` one that reads
        exactly what is asked and nothing ahead: pyarrow's own file for a URI (Parquet footers; a ranged GET per
        read on S3), an unbuffered OS file locally (plan-time line probes, so a 64 KiB probe is not a 1 MiB read)."""
        try:
            if is_uri(path):
                fs, inner = self.filesystem(path)
                native = fs.open_input_file(inner)
                return io.BufferedReader(_Seekable(native), 1 << 20) if buffered else native
            return open(path.removeprefix("file://"), "rb", buffering=1 << 20 if buffered else 0)
        except OSError as exc:
            raise ReadError(_oserror_reason(exc), f"cannot be opened ({exc.strerror or exc})") from None

    def size_of(self, path: str) -> int | None:
        """The size of a file, or None when there is none (a stat / HEAD, never a read)."""
        try:
            if is_uri(path):
                import pyarrow.fs as pafs

                fs, inner = self.filesystem(path)
                info = fs.get_file_info(inner)
                return info.size if info.type == pafs.FileType.File else None
            st = os.stat(path.removeprefix("file://"))
            return st.st_size if stat.S_ISREG(st.st_mode) else None
        except OSError:
            return None

    def open_range(self, path: str, start: int, end: int):
        """A buffered stream of the decompressed content of bytes [start, end) of a file whose compressed
        streams start at ``start`` and end at ``end`` (whole bz2 streams of a multistream dump)."""
        fh = self.open_random_access(path)
        fh.seek(start)
        return self._decompressed(_Limited(fh, end - start), path)

    def open(self, path: str):
        """A buffered binary stream of the decompressed content (by suffix: .gz, .bz2, .zst/.zstd)."""
        return self._decompressed(self.open_raw(path), path)

    @staticmethod
    def _decompressed(raw, path: str):
        kind = compression_of(path)
        if kind == "gz":
            return io.BufferedReader(_Checked(gzip.GzipFile(fileobj=raw, mode="rb"), "gzip"), 1 << 20)
        if kind == "bz2":
            return io.BufferedReader(_Checked(bz2.BZ2File(raw, "rb"), "bzip2"), 1 << 20)
        if kind == "zst":
            return io.BufferedReader(_ZstdStream(raw), 1 << 20)
        return raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(_Checked(raw, "file"), 1 << 20)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """The whole decompressed file, refusing files larger than ``limit`` bytes (record_too_large)."""
        with self.open(path) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ReadError("record_too_large", f"file is larger than {limit} bytes (ingest.max_record_bytes)")
        return data


class _Wrapped(io.RawIOBase):
    """A readable raw stream over ``self.inner`` that closes it with itself."""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()


class _Checked(_Wrapped):
    """Wraps a (decompressing) stream so truncation and corruption surface as :class:`ReadError`."""

    def __init__(self, inner, kind: str):
        self.inner = inner
        self.kind = kind

    def readinto(self, buf) -> int:
        try:  # read1: return what one compressed block gives, so lines before a cut are not lost with it
            data = self.inner.read1(len(buf)) if hasattr(self.inner, "read1") else self.inner.read(len(buf))
        except EOFError as exc:
            raise ReadError("truncated_file", f"{self.kind} stream ends early ({exc})") from None
        except (OSError, zlib.error) as exc:
            if isinstance(exc, ReadError):
                raise
            raise ReadError("corrupt_file", f"{self.kind} data is corrupt ({exc})") from None
        n = len(data)
        buf[:n] = data
        return n


class _Limited(_Wrapped):
    """At most ``n`` bytes of a stream (a byte range), then end of file."""

    def __init__(self, inner, n: int):
        self.inner, self.left = inner, n

    def readinto(self, buf) -> int:
        if self.left <= 0:
            return 0
        data = self.inner.read(min(len(buf), self.left))
        n = len(data)
        buf[:n] = data
        self.left -= n
        return n


class _Seekable(_Checked):
    """A pyarrow random-access file as a seekable raw stream, so ``io.BufferedReader`` gives it ``readline``."""

    def __init__(self, inner):
        super().__init__(inner, "file")

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.inner.seek(pos, whence)

    def tell(self) -> int:
        return self.inner.tell()


class _ZstdStream(_Wrapped):
    """Zstandard frames one after another; python-zstandard's stream reader returns b"" on a cut frame, so we
    drive ``decompressobj`` ourselves and report a frame left open at end of input as ``truncated_file``."""

    def __init__(self, raw):
        import zstandard

        self.inner = raw
        self.zstd = zstandard
        self.dctx = zstandard.ZstdDecompressor()
        self.dobj = self.dctx.decompressobj()
        self.pending = b""
        self.in_frame = False
        self.eof = False

    def _fill(self) -> None:
        while not self.pending and not self.eof:
            chunk = self.inner.read(1 << 20)
            if not chunk:
                self.eof = True
                if self.in_frame:
                    raise ReadError("truncated_file", "zstd stream ends inside a frame")
                return
            while chunk:
                self.in_frame = True
                try:
                    out = self.dobj.decompress(chunk)
                except self.zstd.ZstdError as exc:
                    raise ReadError("corrupt_file", f"zstd data is corrupt ({exc})") from None
                self.pending += out
                if self.dobj.eof:
                    chunk = self.dobj.unused_data
                    self.dobj = self.dctx.decompressobj()
                    self.in_frame = False
                else:
                    chunk = b""

    def readinto(self, buf) -> int:
        self._fill()
        n = min(len(buf), len(self.pending))
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def iter_chunks(fh, size: int = 1 << 20) -> Iterator[bytes]:
    while block := fh.read(size):
        yield block
