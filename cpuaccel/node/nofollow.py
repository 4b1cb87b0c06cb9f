"""Reaching paths below a folder without following symbolic links: descriptors all the way.

Part of cpuaccel's node package (see ``cpuaccel.node``), carried by the sync receiver
(``tree``): stdlib only, Python 3.8+. A path's text says nothing about where it leads
on the node: ``dest/data`` may be a link to ``/elsewhere``, and ``makedirs``, ``open``,
``chmod`` and ``rename`` on that text would all act on ``/elsewhere``. Here every
folder on the way is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one
before (``dir_fd``), so nothing is ever reached through a link.
"""

from __future__ import annotations

import errno
import os
import stat

from cpuaccel.node.common import TMP_MARK, create_new

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Callable, Iterator
    from typing import Any, BinaryIO

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_FOLDER = (errno.ELOOP, errno.ENOTDIR)  # a link (O_NOFOLLOW), or a file


def open_folder(path: str) -> int:
    """A descriptor of the folder ``path``; OSError when its last name is a link."""
    return os.open(path, FOLDER)


def folder_at(parent: int, name: str, create: bool) -> int | None:
    """A descriptor of the folder ``name`` in ``parent``, never through a link.

    With ``create``, a missing folder is made, and a link or file where the folder
    belongs is replaced by one (the link itself goes, never its target). Without,
    None when there is no real folder there.
    """
    try:
        return os.open(name, FOLDER, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        if exc.errno not in _NOT_A_FOLDER:
            raise
        if not create:
            return None
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile by another node of a shared filesystem; a link fails below
    return os.open(name, FOLDER, dir_fd=parent)


class LinkRefused(OSError):
    """A link (or a file) stands where a folder of cpuaccel's own belongs."""


def own_folder_at(parent: int, name: str, mode: int = 0o700) -> int:
    """A descriptor of the folder ``name`` in ``parent``, made with ``mode`` when
    missing; LinkRefused when a link or a file is there. For folders whose content
    must stay where it is put (a run's folder holds its secrets): unlike
    ``folder_at``, nothing is replaced, so nobody's link is silently undone either."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, FOLDER, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in _NOT_A_FOLDER:
            raise
        raise LinkRefused(exc.errno, "a link or a file where a folder belongs", name) from None


def parent_of(root: int, rel: str, create: bool) -> tuple[int, str] | None:
    """(descriptor of rel's folder, rel's last name), reached from ``root`` through real
    folders only (see ``folder_at``); None without ``create`` when the way is not all
    real folders. ``rel`` is '/'-separated, normalised, below root. The caller closes
    the descriptor."""
    *folders, name = rel.split("/")
    fd = os.dup(root)
    for folder in folders:
        try:
            below = folder_at(fd, folder, create)
        finally:
            os.close(fd)
        if below is None:
            return None
        fd = below
    return fd, name


def lstat_at(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_at(parent: int, name: str) -> None:
    """Remove ``name`` in ``parent``: a link or file itself, a real folder with all it
    holds (walked by descriptors: a link inside is removed, never followed)."""
    st = lstat_at(parent, name)
    if st is None:
        return  # another node of a shared filesystem got there first
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        return
    fd = os.open(name, FOLDER, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def sweep(
    root: int,
    mark: str,
    skip: Callable[[str], bool],
    visit: Callable[[int, str, str, os.stat_result], None],
) -> None:
    """One walk below ``root`` by descriptors: every entry whose name holds ``mark``
    (leftover temporary files) is removed, every other one is passed to ``visit(folder,
    name, rel, lstat)`` while its folder is held open. A folder is entered only as a real
    one (opened with O_NOFOLLOW after its listing: one swapped for a link meanwhile is
    neither entered nor visited). Paths (relative, '/'-separated) for which ``skip`` is
    true are left alone, and so is what virtualenvs (a folder holding pyvenv.cfg) hold,
    as a sync skips them.

    Depth first, a folder entered where it is met: only the folders on the way down are
    held open (each listed whole first), so a folder of thousands of subfolders needs no
    more descriptors than the tree is deep (a stack of every subfolder met would run
    out of them, EMFILE, past the node's limit of open files)."""
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []
    try:
        _enter(stack, os.dup(root), "")
        while stack:
            fd, rel, items = stack[-1]
            item = next(items, None)
            if item is None:
                del stack[-1]
                os.close(fd)
                continue
            below = rel + "/" + item.name if rel else item.name
            if skip(below):
                continue
            if mark in item.name:
                remove_at(fd, item.name)
                continue
            st = lstat_at(fd, item.name)
            if st is None:
                continue  # removed since the listing
            inner = None
            if stat.S_ISDIR(st.st_mode):
                inner = folder_at(fd, item.name, create=False)
                if inner is None:
                    continue  # no longer a real folder: not in the tree
            visit(fd, item.name, below, st)
            if inner is not None:
                if _is_venv(inner):
                    os.close(inner)
                else:
                    _enter(stack, inner, below)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _enter(stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]], fd: int, rel: str) -> None:
    """Push the folder open at ``fd`` with its listing (read whole: removing changes it);
    pushed first, so that the caller's clean-up closes it if the listing fails."""
    stack.append((fd, rel, iter(())))
    stack[-1] = (fd, rel, iter(list(os.scandir(fd))))


def _is_venv(folder: int) -> bool:
    """A virtualenv: pyvenv.cfg there (followed, as os.path.exists does in a scan)."""
    try:
        os.stat("pyvenv.cfg", dir_fd=folder)
    except OSError:
        return False
    return True


def _member(tar: Any, member: Any, parent: int, name: str) -> int:
    """Write one entry of the stream at ``name`` in ``parent``; the bytes written."""
    if member.isdir():
        fd = folder_at(parent, name, create=True)  # a link where a folder belongs: replaced
        assert fd is not None
        try:
            os.fchmod(fd, member.mode & 0o777)  # the folder itself: never through a link
        finally:
            os.close(fd)
        return 0
    tmp = "." + name + TMP_MARK + os.urandom(8).hex()
    if member.issym():
        os.symlink(member.linkname, tmp, dir_fd=parent)
    elif member.isfile():
        source = tar.extractfile(member)
        with os.fdopen(create_new(tmp, 0o600, dir_fd=parent), "wb") as out:
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), member.mode & 0o777)  # no setuid/setgid from a stream
            os.utime(out.fileno(), (member.mtime, member.mtime))
    else:
        raise ValueError(f"unsupported entry in the stream: {member.name!r}")
    st = lstat_at(parent, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        remove_at(parent, name)  # a folder became a file or a link
    # atomic: readers see the old file or the new one; a link there is replaced itself
    os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    return int(member.size) if member.isfile() else 0


def unpack(
    dest: str, stream: BinaryIO, rel_of: Callable[[str], str], names: list[str] | None = None
) -> int:
    """Write a tar stream's entries below DEST (each name checked by ``rel_of``), each
    through a new temporary file renamed into place; the bytes written. ``names``
    receives each entry's checked path."""
    import tarfile

    written = 0
    root = open_folder(dest)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                rel = rel_of(member.name)
                if names is not None:
                    names.append(rel)
                way = parent_of(root, rel, create=True)
                assert way is not None
                try:
                    written += _member(tar, member, *way)
                finally:
                    os.close(way[0])
    finally:
        os.close(root)
    return written


def delete(dest: str, rels: list[str], rel_of: Callable[[str], str]) -> None:
    """Remove each path below DEST; one behind a link is not in DEST's tree: left alone."""
    root = open_folder(dest)
    try:
        for rel in rels:
            way = parent_of(root, rel_of(rel), create=False)
            if way is not None:
                try:
                    remove_at(*way)
                finally:
                    os.close(way[0])
    finally:
        os.close(root)


def lstat_below(root: int, rel: str) -> os.stat_result | None:
    """rel's lstat, or None when it is missing or reached only through a link."""
    way = parent_of(root, rel, create=False)
    if way is None:
        return None
    try:
        return lstat_at(*way)
    finally:
        os.close(way[0])
