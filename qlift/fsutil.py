"""File-system helpers every stage uses: atomic outputs, hashing, sizes."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO

from qlift.errors import BadInputError, OutputExistsError, UnsafeInputError


class HashCancelled(Exception):
    """A FileHashes pool was cancelled while it read a file."""


class _StoppableReader(io.RawIOBase):
    """A file for ``hashlib.file_digest`` that gives up at its next read once ``stop`` is set, so
    cancelling a hash of a multi-GB file takes one read, not the rest of the file."""

    def __init__(self, fh: BinaryIO, stop: threading.Event) -> None:
        self._fh, self._stop = fh, stop

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._stop.is_set():
            raise HashCancelled
        return self._fh.readinto(buffer)  # type: ignore[attr-defined, no-any-return]


def sha256_file(path: Path, stop: threading.Event | None = None) -> str:
    """sha256 hex digest of a file (hashlib.file_digest: reads outside the GIL)."""
    with open(path, "rb", buffering=0) as fh:
        src = _StoppableReader(fh, stop) if stop is not None else fh
        return hashlib.file_digest(src, "sha256").hexdigest()


class AppendedLines:
    """The whole lines a growing file (a log) got since the last ``read``: a half-written last line waits for the
    next read; a file that shrank (rotated, truncated) is read again from its start."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def skip_existing(self) -> None:
        """Read only what is appended from now on (what the file holds now is skipped)."""
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                if fh.seek(0, os.SEEK_END) < self.offset:
                    self.offset = 0
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode("utf-8", errors="replace").splitlines()


class FileHashes:
    """sha256 of whole files on a thread pool, started at once and collected with ``result()``;
    ``cancel()`` stops every thread within one read. The one file hasher: lineage manifests,
    lockfiles, downloads and merge's inputs all use it (or ``sha256_file`` for a single file)."""

    def __init__(self, paths: Iterable[Path], threads: int = 1, *, more: bool = False) -> None:
        """``more``: files are also ``add()``-ed later, as they are written (the pool keeps ``threads``)."""
        self._paths = [Path(p) for p in paths]
        self._stop = threading.Event()
        size = threads if more else min(threads, len(self._paths) or 1)
        self._pool = ThreadPoolExecutor(max(1, size), thread_name_prefix="qlift-hash")
        self._futures = [self._pool.submit(sha256_file, p, self._stop) for p in self._paths]
        if not more:
            self._pool.shutdown(wait=False)

    def add(self, path: Path) -> None:
        """Hash one more file (a hasher made with ``more=True``, before ``result()`` or ``cancel()``)."""
        self._paths.append(Path(path))
        self._futures.append(self._pool.submit(sha256_file, Path(path), self._stop))

    def each(self) -> Iterator[tuple[Path, str]]:
        """(path, sha256 hex digest) in the order given, each as soon as it is ready."""
        for p, f in zip(self._paths, self._futures, strict=True):
            yield p, f.result()

    def done(self) -> bool:
        """Whether every file is hashed (``result()`` will not wait)."""
        return all(f.done() for f in self._futures)

    def result(self) -> dict[str, str]:
        """Resolved path -> sha256 hex digest of every file given (the first error is raised)."""
        self._pool.shutdown(wait=False)  # nothing is added after this; the threads end with their files
        return {str(p.resolve()): digest for p, digest in self.each()}

    def cancel(self) -> None:
        self._pool.shutdown(wait=False)
        self._stop.set()
        for f in self._futures:
            f.cancel()
        wait(self._futures)


def hash_threads() -> int:
    """Files hashed at once: one per core this process may use, up to four (disks saturate)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def sha256_files(paths: Iterable[Path], threads: int | None = None) -> dict[str, str]:
    """Resolved path -> sha256 of each file, ``threads`` (default ``hash_threads()``) at once."""
    return FileHashes(paths, threads or hash_threads()).result()


@contextlib.contextmanager
def file_lock(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive flock on ``path`` (created if missing) with this pid written in it. ``wait=False``: yields
    False at once when another process holds it. Closing lets go; so does dying, even by SIGKILL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        with contextlib.suppress(OSError):  # a full disk must not stop what the lock guards (an abort, say)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        yield True
    finally:
        os.close(fd)


def lock_holder(path: Path) -> int | None:
    """The pid holding ``path``'s file_lock (-1 if it wrote none), or None when nobody does."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # we got it: nobody holds it exclusively
    except BlockingIOError:
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else -1
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON to ``path`` via a temp file and a rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def contained(directory: Path, name: object, *, source: Path | str) -> Path:
    """``directory / name`` for a file name read from ``source`` (an index, lockfile or manifest),
    refused with exit 5 when it is absolute or leads outside ``directory`` (``..``, a symlink)."""
    text = str(name)
    rel = Path(text)
    root = Path(directory).resolve()
    inside = not rel.is_absolute() and "\0" not in text and text not in ("", ".") and \
        (root / rel).resolve().is_relative_to(root)
    if not inside:
        raise UnsafeInputError(
            f"{source} names the file {text!r}, which lies outside {directory}",
            hint="Refusing it: entries must be paths inside the directory. Restore the file or fetch it again.",
        )
    return Path(directory) / rel


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_output_dirs(path: Path, *, named: str) -> None:
    """``mkdir -p path`` for an output directory the user named (``named``: the flag or the file and field).
    One rule for every output: a path that cannot be created or written (``/proc/x``, ``/dev/null/x``, a
    read-only directory) is a bad argument, BadInputError (exit 2), in one line; "not found" is for inputs."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"{named}: cannot create the directory {path} ({exc.strerror or exc})",
                            hint="Choose a directory you can create and write to.") from None


def check_output_path(out: Path, *, force: bool, inputs: Iterable[Path | str] = ()) -> None:
    """Fail early, before any work, when ``out`` exists and ``force`` is off, or when ``out``
    is, contains or lies inside one of ``inputs`` (symlinks resolved): ``--force`` must never
    replace or write into what the command reads."""
    out = Path(out)
    check_not_an_input(out, inputs)
    if out.exists() and not force:
        raise OutputExistsError(out)
    if not out.parent.exists():
        raise BadInputError(
            f"parent directory {out.parent} of the output does not exist",
            hint="Create it first or choose another -o path.",
        )
    try:  # a real probe: os.access says yes to root on read-only mounts (/sys, ro bind mounts)
        os.rmdir(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.probe."))
    except OSError as exc:
        raise BadInputError(
            f"cannot write into {out.parent} ({exc.strerror or 'permission denied'})",
            hint="Choose an -o path in a directory you can write to.",
        ) from None


def _resolved(path: Path | str) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop
        raise BadInputError(f"cannot resolve {path} ({exc})", hint="Fix or remove the symlink.") from None


def check_not_an_input(out: Path, inputs: Iterable[Path | str]) -> None:
    """Refuse an output path that is, contains, or lies inside an input path."""
    target = _resolved(out)
    for given in inputs:
        src = _resolved(given)
        if target == src:
            how = "is"
        elif src.is_relative_to(target):
            how = "contains"
        elif target.is_relative_to(src):
            how = "lies inside"
        else:
            continue
        raise BadInputError(
            f"output {out} {how} the input {given}; writing it would destroy or corrupt the input",
            hint="Choose an -o path outside every input.",
        )


@contextlib.contextmanager
def atomic_output_dir(out: Path, *, force: bool = False, inputs: Iterable[Path | str] = ()) -> Iterator[Path]:
    """Yield a temp dir beside ``out``; rename it to ``out`` only if the block succeeds.

    A failure or Ctrl-C removes the temp dir and leaves any existing ``out`` untouched.
    With ``force`` an existing ``out`` is replaced only after the new one is complete.
    Without it the final rename never replaces: when another run created ``out`` meanwhile,
    this one fails with OutputExistsError and the other's result stays.
    """
    out = Path(out)
    check_output_path(out, force=force, inputs=inputs)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; an output dir should not be
    try:
        yield tmp
        _place(tmp, out, force=force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _place(tmp: Path, out: Path, *, force: bool) -> None:
    old: Path | None = None
    if force and out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    try:
        rename_noreplace(tmp, out)
    except FileExistsError:
        if old is not None:  # another run placed its output in between: keep theirs, ours fails
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        raise OutputExistsError(out) from None
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, raising FileExistsError if ``dst`` exists (atomically, where
    Linux's renameat2 is there; else by claiming ``dst`` with an exclusive mkdir first)."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(err), str(dst))
        if err not in (errno.EINVAL, errno.ENOSYS):  # file systems without the flag fall through
            raise OSError(err, os.strerror(err), str(dst))
    if Path(src).is_dir():
        os.mkdir(dst)  # raises FileExistsError; renaming onto our own empty dir then replaces it
    elif os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    os.rename(src, dst)


@functools.cache
def _renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` when on one file system, else copy it. Only for files
    nothing else keeps (a staging area removed afterwards): the two names share one inode."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


_FICLONE = 0x40049409


def copy_file(src: Path, dst: Path) -> None:
    """An independent copy of ``src`` at ``dst``: a reflink where the file system has them
    (instant, copy-on-write), else a plain copy. Editing one never changes the other."""
    try:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
    except OSError:
        shutil.copyfile(src, dst)  # sendfile / copy_file_range under the hood
    shutil.copystat(src, dst)
