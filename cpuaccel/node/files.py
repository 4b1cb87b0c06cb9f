"""command and shell, file, copy and stat: Ansible's modules of the same names."""

from __future__ import annotations

import os

from cpuaccel.node.common import create_new, write_atomic
from cpuaccel.node.destination import resolve
from cpuaccel.node.moduleutil import (
    DIFF_LIMIT,
    Fail,
    expand,
    octal,
    run,
    sha1_file,
    want_mode,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cpuaccel.node.moduleutil import Reply


def _matches(pattern: str) -> bool:
    if any(c in pattern for c in "*?["):
        import glob

        return bool(glob.glob(pattern))
    return os.path.lexists(pattern)


def mod_command(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import time

    cmd: Any
    if args.get("shell"):
        cmd = str(args["cmd"])
        argv = [str(args.get("executable") or "/bin/sh"), "-c", cmd]
    elif args.get("argv") is not None:
        cmd = argv = [str(a) for a in args["argv"]]
    else:
        import shlex

        cmd = argv = shlex.split(str(args["cmd"]))
    if not argv:
        raise Fail("no command given", cmd=cmd)
    chdir = expand(args["chdir"]) if args.get("chdir") else None
    if chdir is not None and not os.path.isdir(chdir):
        raise Fail(f"Unable to change directory before execution: {chdir} is not a directory")
    for key, skip_if_there in (("creates", True), ("removes", False)):
        if args.get(key):
            where = os.path.join(chdir or "", expand(args[key]))  # relative: to chdir, as Ansible
            if _matches(where) == skip_if_there:
                msg = f"skipped, since {where} {'exists' if skip_if_there else 'does not exist'}"
                return dict(cmd=cmd, changed=False, rc=0, stdout=msg, stderr="", msg=msg)
    if check:
        return {"cmd": cmd, "changed": False, "skipped": True, "msg": "skipped in check mode"}
    env = None
    if args.get("environment"):
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in args["environment"].items()})
    data = None
    if args.get("stdin") is not None:  # Ansible's stdin_add_newline defaults to true
        data = (str(args["stdin"]) + ("\n" if args.get("stdin_add_newline", True) else "")).encode()
    timeout = float(args["timeout"]) if args.get("timeout") else None
    start = time.time()
    try:
        rc, out, err, timed_out = run(argv, cwd=chdir, env=env, stdin=data, timeout=timeout)
    except OSError as exc:  # the program does not exist or cannot be run
        raise Fail(str(exc), cmd=cmd, rc=exc.errno or 2) from None
    end = time.time()
    reply = {
        "cmd": cmd,
        "rc": rc,
        "stdout": out.rstrip("\r\n"),
        "stderr": err.rstrip("\r\n"),
        "start": start,
        "end": end,
        "delta": round(end - start, 6),
        "changed": True,
    }
    if timed_out:
        reply.update(failed=True, msg=f"the command timed out after {timeout:g} seconds")
    elif rc:
        reply.update(failed=True, msg="non-zero return code")
    return reply


# ---------------------------------------------------------------- file, copy, stat


def _kind(path: str) -> str:
    if os.path.islink(path):
        return "link"
    if os.path.isdir(path):
        return "directory"
    return "file" if os.path.lexists(path) else "absent"


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)


def chmod_here(path: str, mode: int) -> None:
    """chmod ``path`` itself, never what a link there points to (``follow_symlinks=False``
    semantics, which Linux's chmod lacks): through a descriptor opened without
    following a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except PermissionError:  # not readable by us: the path itself, checked just before
        if os.path.islink(path):
            raise Fail(f"{path} is a symbolic link: refusing to change its target") from None
        os.chmod(path, mode)
        return
    except OSError as exc:
        if os.path.islink(path):
            raise Fail(f"{path} is a symbolic link: refusing to change its target") from None
        raise exc
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _refuse_link(path: str, state: str) -> None:
    """file's states that write, touch or chmod act on the path itself: a link there
    (placed by someone else, or left over) would have them act on its target."""
    if os.path.islink(path):
        raise Fail(
            f"{path} is a symbolic link (to {os.readlink(path)}): refusing state={state} "
            "through it; give the real path, or remove the link first (state: absent)",
            path=path,
            state="link",
        )


def _makedirs(path: str, mode: int | None) -> None:
    """Create path and its missing parents, each with ``mode`` (as Ansible does)."""
    missing, current = [], path
    while current and not os.path.lexists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for folder in reversed(missing):
        os.mkdir(folder)
        if mode is not None:
            chmod_here(folder, mode)


def _set_times(path: str, args: dict[str, Any], default: str, act: bool) -> bool:
    """Whether the file's times change (set to now when ``act``)."""
    times = [str(args.get(k) or default) for k in ("access_time", "modification_time")]
    if any(t not in ("now", "preserve") for t in times):
        raise Fail(f"access_time and modification_time take now or preserve, not {times}")
    if "now" not in times:
        return False
    if act:
        import time

        st, now = os.lstat(path), time.time_ns()
        os.utime(
            path,
            ns=(
                now if times[0] == "now" else st.st_atime_ns,
                now if times[1] == "now" else st.st_mtime_ns,
            ),
            follow_symlinks=False,
        )
    return True


def mod_file(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import stat

    path = expand(args["path"]).rstrip("/") or "/"
    state = str(args.get("state") or "file")
    mode = want_mode(args)
    before = _kind(path)
    if state != "absent":
        _refuse_link(path, state)
    before_mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else None
    changed = False
    if state == "absent":
        if before != "absent":
            changed = True
            if not check:
                _remove(path)
    elif state == "directory":
        if not os.path.isdir(path):
            if before != "absent":
                raise Fail(f"{path} already exists as a {before}", path=path, state=before)
            changed = True
            if not check:
                _makedirs(path, mode)
    elif state == "touch":
        if not os.path.exists(path):
            changed = True
            if not check:
                os.close(create_new(path, 0o666))  # new, and never through a link
    elif state == "file":
        if not os.path.exists(path):
            raise Fail(f"file ({path}) is absent, cannot continue", path=path, state="absent")
        if os.path.isdir(path):
            raise Fail(f"file ({path}) is directory, cannot continue", path=path, state="directory")
    else:
        raise Fail(f"unsupported state {state!r}", path=path)
    reply: Reply = {"path": path, "state": state}
    if state != "absent":
        there = os.path.exists(path)  # False in check mode for what would be created
        # Ansible: touch sets both times to now unless told to preserve them; other states
        # preserve both unless told otherwise.
        if _set_times(path, args, "now" if state == "touch" else "preserve", there and not check):
            changed = True
        now_mode = stat.S_IMODE(os.stat(path).st_mode) if there else None
        if mode is not None and mode != now_mode:
            changed = True
            if there and not check:
                chmod_here(path, mode)
            now_mode = mode
        reply["state"] = "directory" if state == "directory" or os.path.isdir(path) else "file"
        if now_mode is not None:
            reply["mode"] = octal(now_mode)
    reply["changed"] = changed
    if diff:
        old: Reply = {"path": path, "state": before}
        new: Reply = {"path": path, "state": reply["state"]}
        if before_mode is not None and reply.get("mode") not in (None, octal(before_mode)):
            old["mode"], new["mode"] = octal(before_mode), reply["mode"]
        reply["diff"] = {"before": old, "after": new}
    return reply


def _text_diff(dest: str, old: bytes | None, new: bytes) -> Reply:
    if old is None or len(old) > DIFF_LIMIT or len(new) > DIFF_LIMIT:
        return {"binary": True}
    try:
        before, after = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:
        return {"binary": True}
    return {"before": before, "after": after, "before_header": dest, "after_header": dest}


def mod_copy(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import base64
    import hashlib
    import stat

    dest = expand(args["dest"])
    # A probe (a large source) names the content by its sha1 and size alone: when dest
    # holds it already, or need not change, no byte of it has to come.
    probe = bool(args.get("probe"))
    data = b"" if probe else base64.b64decode(args.get("content_b64") or "")
    checksum = str(args["checksum"]) if probe else hashlib.sha1(data).hexdigest()
    size = int(args.get("size", 0)) if probe else len(data)
    if not probe and args.get("checksum") and args["checksum"] != checksum:
        raise Fail(f"the content for {dest} arrived damaged (sha1 mismatch)", dest=dest)
    if dest.endswith("/") or os.path.isdir(dest):
        raise Fail(f"Destination {dest} is a directory: give the file's path", dest=dest)
    parent = os.path.dirname(dest) or "."
    if not os.path.isdir(parent):
        if check:  # in a dry run, an earlier task that would make the folder did not run
            return {"dest": dest, "checksum": checksum, "size": size, "changed": True,
                    "msg": f"{parent} does not exist yet"}  # fmt: skip
        raise Fail(f"Destination directory {parent} does not exist", dest=dest)
    mode = want_mode(args)
    reply: Reply = {"dest": dest, "checksum": checksum, "size": size, "changed": False}
    try:  # a link at dest is replaced by the file (Ansible's follow: no), never written through
        old = os.lstat(dest)
        old_mode: int | None = None if stat.S_ISLNK(old.st_mode) else stat.S_IMODE(old.st_mode)
    except FileNotFoundError:
        old_mode = None
    if old_mode is not None and not args.get("force", True):
        reply.update(msg="file already exists", mode=octal(old_mode))
        return reply
    old_sum, old_data = sha1_file(dest, DIFF_LIMIT) if old_mode is not None else (None, b"")
    final = old_mode if mode is None else mode  # what dest's mode is or will be
    if old_sum == checksum:
        if mode is not None and mode != old_mode:
            reply["changed"] = True
            if not check:
                chmod_here(dest, mode)
    elif probe and not check:
        return {"dest": dest, "changed": False, "wants_content": True}
    else:
        reply["changed"] = True
        if diff:
            reply["diff"] = {"binary": True} if probe else _text_diff(dest, old_data, data)
        if not check:
            write_atomic(dest, data, mode, durable=True)  # permission bits only, then
            if mode is not None and mode & ~0o777:
                chmod_here(dest, mode)  # the setuid/setgid/sticky bits the playbook asks for
            final = stat.S_IMODE(os.stat(dest).st_mode)  # a new file's: per the umask
    if final is not None:
        reply["mode"] = octal(final)
    return reply


def mod_stat(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import stat

    path = expand(args["path"])
    try:
        st = os.stat(path) if args.get("follow") else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"changed": False, "stat": {"exists": False, "path": path}}
    info: Reply = {
        "exists": True,
        "path": path,
        "isdir": stat.S_ISDIR(st.st_mode),
        "isreg": stat.S_ISREG(st.st_mode),
        "islnk": stat.S_ISLNK(st.st_mode),
        "mode": octal(stat.S_IMODE(st.st_mode)),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "atime": st.st_atime,
        "ctime": st.st_ctime,
        "uid": st.st_uid,
        "gid": st.st_gid,
    }
    if info["islnk"]:
        info["lnk_target"] = os.readlink(path)
    if info["isreg"] and args.get("get_checksum", True) and os.access(path, os.R_OK):
        info["checksum"] = sha1_file(path)[0]
    return {"changed": False, "stat": info}


def mod_tree(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    """Every entry below ``path``: files as [size, whole-second mtime, mode], folders as
    [-1, 0, mode]. synchronize's quick check: rsync -a keeps these, so equal listings
    mean rsync would send nothing, and the controller skips its ssh handshake."""
    root = expand(args["path"])
    files: dict[str, list[int]] = {}
    if not os.path.isdir(root):
        return {"changed": False, "exists": False, "files": files}
    import stat

    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            mode = stat.S_IMODE(st.st_mode)
            entry = (
                [-1, 0, mode] if stat.S_ISDIR(st.st_mode) else [st.st_size, int(st.st_mtime), mode]
            )
            files[os.path.relpath(path, root)] = entry
    return {"changed": False, "exists": True, "files": files}


def mod_destination(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    """May a push with ``delete`` own ``path``? synchronize asks before rsync runs, with
    the rule of ``cpuaccel sync --delete`` (cpuaccel.node.destination), judged here,
    on the path as it resolves on this node: {"dest": resolved, "refused": why|None}."""
    dest, refused = resolve(str(args["path"]), args.get("workdir"))
    return {"changed": False, "dest": dest, "refused": refused}
