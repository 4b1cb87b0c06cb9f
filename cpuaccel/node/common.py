"""What every node program shares: finding a command, creating and writing files
safely (and the marker of their temporary files), and reading which distributions are
installed.

Part of cpuaccel's node package (see ``cpuaccel.node``): stdlib only, Python 3.8+, and
``os`` the only import, because the fact probe carries this part too and the node pays
for every import.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Iterator

# In the name of every temporary file a node program writes: a sync skips such files and
# the next sync's writer removes them, whichever program left them.
TMP_MARK = ".cpuaccel-tmp-"


def temp_name(path: str) -> str:
    """A fresh hidden name next to ``path``, for a file renamed onto ``path`` later.

    Random (64 bits), so that nobody can place a link there in advance; every creator
    still opens it with ``O_EXCL | O_NOFOLLOW`` (``create_new``)."""
    folder, base = os.path.split(path)
    return os.path.join(folder, "." + base + TMP_MARK + os.urandom(8).hex())


def create_new(path: str, mode: int = 0o600, dir_fd: int | None = None) -> int:
    """A descriptor of a file created here and now: never an existing file, never
    through a symbolic link; ``mode`` is masked to the permission bits (no setuid,
    setgid or sticky bit from anyone's input) and then the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, mode & 0o777, dir_fd=dir_fd)


def which(name: str) -> str | None:
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def write_atomic(
    dest: str,
    data: bytes,
    mode: int | None = None,
    durable: bool = False,
    dir_fd: int | None = None,
) -> None:
    """Write through a temporary file in dest's folder, renamed onto dest: readers see
    the old file or the new one, never half of one. The one way node programs write a
    file: the temporary file is new (``create_new``), and a symbolic link at dest is
    replaced, never written through.

    With ``mode`` (masked to 0o777) the file is created with it (a secret is never
    readable by others, not even for a moment) and set to it whatever the umask;
    without, a replaced regular file keeps its mode. A replaced regular file keeps its
    owner when root writes it. ``durable`` syncs the data to disk before the rename (a
    playbook's copy; not a cache). With ``dir_fd``, ``dest`` is a name in that folder
    (reached by a descriptor, never through a link: cpuaccel.node.nofollow).
    """
    import stat

    try:
        old: os.stat_result | None = os.stat(dest, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        old = None  # a link's target (or a folder) lends nothing to the new file
    tmp = temp_name(dest)
    # New files without a mode: per umask, as any program creates them.
    fd = create_new(tmp, 0o666 if mode is None else mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
            if mode is None and old is not None:
                mode = stat.S_IMODE(old.st_mode)
            if mode is not None:
                os.fchmod(f.fileno(), mode & 0o777)
            owner = (old.st_uid, old.st_gid) if old is not None else None
            if owner is not None and os.geteuid() == 0 and owner != (0, os.getgid()):
                os.fchown(f.fileno(), *owner)
        os.replace(tmp, dest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares them: runs of -_. are one -, lower case.

    Without ``re``: the fact probe does not import it (its import costs more than the
    probe's own work)."""
    name = name.lower().replace("_", "-").replace(".", "-")
    while "--" in name:
        name = name.replace("--", "-")
    return name


def dist_infos(folders: list[str]) -> Iterator[tuple[str, str | None, str]]:
    """(normalised name, version or None, path) of each ``.dist-info`` and ``.egg-info``
    in the folders, in order (the first on an import path is the one imported).

    The folder names carry both name and version (PEP 427: ``NAME-VERSION.dist-info``;
    ``NAME-VERSION-pyX.Y.egg-info``), so no file is read and importlib.metadata, whose
    import alone costs more than the fact probe, is not needed.
    """
    for folder in folders:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            stem, _, kind = entry.rpartition(".")
            if kind not in ("dist-info", "egg-info"):
                continue
            parts = stem.split("-")
            if kind == "egg-info" or len(parts) < 2:
                name, version = parts[0], (parts[1] if len(parts) > 1 else None)
            else:
                name, version = "-".join(parts[:-1]), parts[-1]
            yield normalise(name), version or None, os.path.join(folder, entry)
