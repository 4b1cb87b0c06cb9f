"""The node side of ``cpuaccel provision``: a resident, stdlib-only module runner.

Started once per host per playbook run as ``python -c BOOT LENGTH``
(cpuaccel.connectors.programs): its source comes first on stdin, then requests, one
JSON object a line::

    {"id": 3, "module": "copy", "args": {...}, "check": false, "diff": true}

Each gets one JSON line back, in order: ``{"id": 3, "changed": ..., "failed": ...,
...}``; the first line written is ``{"ready": true, ...}``. Arguments arrive validated
and rendered by the controller. The modules follow Ansible's of the same names (command
and shell, file, copy and template, pip, stat), plus ``setvars``, which finds an Intel
oneAPI environment script and checks that it sources. In check mode nothing changes.

Like every node program it runs on Python 3.8+ with the standard library alone and
imports lazily: the node pays for each import, and a run uses a few modules only.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: the node pays for every import
    from collections.abc import Callable
    from typing import Any, TypeAlias

    Reply: TypeAlias = "dict[str, Any]"
    Handler: TypeAlias = "Callable[[dict[str, Any], bool, bool], Reply]"
    Version: TypeAlias = "tuple[Any, ...]"  # (epoch, release, pre, post, dev, local)

DIFF_LIMIT = 64 * 1024  # larger files are reported changed without their text
TAIL = 4000  # characters of pip's output kept in a reply
TMP_MARK = ".cpxl-tmp-"
MARK = "__CPUACCEL_OK__"  # printed once a setvars script is sourced, before its env


class Fail(Exception):
    """A module's failure: its message and any fields for the reply."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


def _path(value: Any) -> str:
    return os.path.expanduser(str(value))


def _octal(mode: int) -> str:
    return f"{mode:04o}"


def _want_mode(args: dict[str, Any]) -> int | None:
    mode = args.get("mode")
    return None if mode is None else mode if isinstance(mode, int) else int(str(mode), 8)


def _list(value: Any) -> list[str]:
    return (
        [] if value is None else [str(value)] if isinstance(value, str) else [str(v) for v in value]
    )


def _which(name: str) -> str | None:
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def _run(
    argv: list[str],
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float | None = None,
) -> tuple[int, str, str, bool]:
    """(rc, stdout, stderr, timed out) of argv; output decoded leniently.

    The child never inherits stdin: the agent's stdin carries the requests. It leads a
    session of its own so that a timeout kills what it started too.
    """
    import signal
    import subprocess

    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else pipe,
        stdout=pipe,
        stderr=pipe,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            proc.kill()  # the group is gone already; make sure of the child itself
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild left the group, holding the pipes
            out, err = b"", b""
            proc.wait()
    return (
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        timed_out,
    )


def _write_atomic(dest: str, data: bytes, mode: int | None) -> None:
    """Write through a temporary file in dest's folder, renamed onto dest: readers see
    the old file or the new one, never half of one. A replaced file keeps its mode (and
    its owner, when root writes it) unless ``mode`` is given."""
    import stat

    try:
        old: os.stat_result | None = os.stat(dest)
    except FileNotFoundError:
        old = None
    tmp = os.path.join(
        os.path.dirname(dest) or ".", "." + os.path.basename(dest) + TMP_MARK + os.urandom(4).hex()
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # new files: per umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is None and old is not None:
            mode = stat.S_IMODE(old.st_mode)
        if mode is not None:
            os.chmod(tmp, mode)
        if old is not None and os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, os.getgid()):
            os.chown(tmp, old.st_uid, old.st_gid)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _sha1_file(path: str, keep: int = 0) -> tuple[str, bytes | None]:
    """The file's sha1, and its bytes when there are at most ``keep`` of them."""
    import hashlib

    digest, chunks, size = hashlib.sha1(), [], 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            if size <= keep:
                chunks.append(chunk)
    return digest.hexdigest(), b"".join(chunks) if size <= keep else None


# ---------------------------------------------------------------- command / shell


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
    chdir = _path(args["chdir"]) if args.get("chdir") else None
    if chdir is not None and not os.path.isdir(chdir):
        raise Fail(f"Unable to change directory before execution: {chdir} is not a directory")
    for key, skip_if_there in (("creates", True), ("removes", False)):
        if args.get(key):
            where = os.path.join(chdir or "", _path(args[key]))  # relative: to chdir, as Ansible
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
        rc, out, err, timed_out = _run(argv, cwd=chdir, env=env, stdin=data, timeout=timeout)
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


def _makedirs(path: str, mode: int | None) -> None:
    """Create path and its missing parents, each with ``mode`` (as Ansible does)."""
    missing, current = [], path
    while current and not os.path.lexists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for folder in reversed(missing):
        os.mkdir(folder)
        if mode is not None:
            os.chmod(folder, mode)


def mod_file(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import stat

    path = _path(args["path"]).rstrip("/") or "/"
    state = str(args.get("state") or "file")
    mode = _want_mode(args)
    before = _kind(path)
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
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
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
        default = "now" if state == "touch" else "preserve"
        times = [str(args.get(k) or default) for k in ("access_time", "modification_time")]
        if any(t not in ("now", "preserve") for t in times):
            raise Fail(f"access_time and modification_time take now or preserve, not {times}")
        if "now" in times:
            changed = True
            if there and not check:
                import time

                st, now = os.stat(path), time.time_ns()
                os.utime(
                    path,
                    ns=(
                        now if times[0] == "now" else st.st_atime_ns,
                        now if times[1] == "now" else st.st_mtime_ns,
                    ),
                )
        now_mode = stat.S_IMODE(os.stat(path).st_mode) if there else None
        if mode is not None and mode != now_mode:
            changed = True
            if there and not check:
                os.chmod(path, mode)
            now_mode = mode
        reply["state"] = "directory" if state == "directory" or os.path.isdir(path) else "file"
        if now_mode is not None:
            reply["mode"] = _octal(now_mode)
    reply["changed"] = changed
    if diff:
        old: Reply = {"path": path, "state": before}
        new: Reply = {"path": path, "state": reply["state"]}
        if before_mode is not None and reply.get("mode") not in (None, _octal(before_mode)):
            old["mode"], new["mode"] = _octal(before_mode), reply["mode"]
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

    dest = _path(args["dest"])
    data = base64.b64decode(args.get("content_b64") or "")
    checksum = hashlib.sha1(data).hexdigest()
    if args.get("checksum") and args["checksum"] != checksum:
        raise Fail(f"the content for {dest} arrived damaged (sha1 mismatch)", dest=dest)
    if dest.endswith("/") or os.path.isdir(dest):
        raise Fail(f"Destination {dest} is a directory: give the file's path", dest=dest)
    parent = os.path.dirname(dest) or "."
    if not os.path.isdir(parent):
        if check:  # in a dry run, an earlier task that would make the folder did not run
            return {"dest": dest, "checksum": checksum, "size": len(data), "changed": True,
                    "msg": f"{parent} does not exist yet"}  # fmt: skip
        raise Fail(f"Destination directory {parent} does not exist", dest=dest)
    mode = _want_mode(args)
    reply: Reply = {"dest": dest, "checksum": checksum, "size": len(data), "changed": False}
    try:
        old_mode: int | None = stat.S_IMODE(os.stat(dest).st_mode)
    except FileNotFoundError:
        old_mode = None
    if old_mode is not None and not args.get("force", True):
        reply.update(msg="file already exists", mode=_octal(old_mode))
        return reply
    old_sum, old_data = _sha1_file(dest, DIFF_LIMIT) if old_mode is not None else (None, b"")
    final = old_mode if mode is None else mode  # what dest's mode is or will be
    if old_sum == checksum:
        if mode is not None and mode != old_mode:
            reply["changed"] = True
            if not check:
                os.chmod(dest, mode)
    else:
        reply["changed"] = True
        if diff:
            reply["diff"] = _text_diff(dest, old_data, data)
        if not check:
            _write_atomic(dest, data, mode)
            final = stat.S_IMODE(os.stat(dest).st_mode)  # a new file's: per the umask
    if final is not None:
        reply["mode"] = _octal(final)
    return reply


def mod_stat(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import stat

    path = _path(args["path"])
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
        "mode": _octal(stat.S_IMODE(st.st_mode)),
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
        info["checksum"] = _sha1_file(path)[0]
    return {"changed": False, "stat": info}


# ---------------------------------------------------------------- pip: versions (PEP 440)

_VERSION = (
    r"v?(?:(\d+)!)?(\d+(?:\.\d+)*)"  # epoch, release
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"  # pre-release
    r"(?:-(\d+)|[-_.]?(post|rev|r)[-_.]?(\d*))?"  # post-release
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"  # development release
    r"(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?"  # local label
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def parse_version(text: str) -> Version | None:
    """(epoch, release, pre, post, dev, local) of a PEP 440 version; None if it is not one."""
    import re  # already loaded by json: costs nothing

    m = re.fullmatch(_VERSION, text.strip().lower())
    if m is None:
        return None
    g = m.groups()
    pre = (_PRE[g[2]], int(g[3] or 0)) if g[2] else None
    post = int(g[4] or g[6] or 0) if g[4] or g[5] else None
    dev = int(g[8] or 0) if g[7] else None
    local = tuple(
        (1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"[-_.]", g[9] or "") if p
    )  # numeric parts sort after alphanumeric ones
    return (int(g[0] or 0), tuple(int(p) for p in g[1].split(".")), pre, post, dev, local)


def _key(v: Version, local: bool = True) -> tuple[Any, ...]:
    """A sort key with PEP 440's order: 1.0.dev0 < 1.0a1 < 1.0 < 1.0+x < 1.0.post1."""
    epoch, release, pre, post, dev, loc = v
    while len(release) > 1 and release[-1] == 0:  # 1.0 == 1.0.0
        release = release[:-1]
    if pre is None:
        pre = (-1, 0) if post is None and dev is not None else (3, 0)
    return (
        epoch,
        release,
        pre,
        -1 if post is None else post,
        (1, 0) if dev is None else (0, dev),
        loc if local else (),
    )


def _is_pre(v: Version) -> bool:
    return v[2] is not None or v[4] is not None


def _prefix_match(v: Version, epoch: int, prefix: tuple[int, ...]) -> bool:
    release = v[1] + (0,) * max(0, len(prefix) - len(v[1]))
    return bool(v[0] == epoch and release[: len(prefix)] == prefix)


def version_matches(version: str, op: str, spec: str) -> bool:
    """Whether an installed version satisfies one specifier, as pip decides it (an
    installed pre-release counts, and a local label is ignored unless the spec has one)."""
    if op == "===":
        return version.strip().lower() == spec.strip().lower()
    v = parse_version(version)
    if v is None:  # not a PEP 440 version: pip ≥ 24.1 matches it with nothing either
        return False
    if spec.endswith(".*"):
        s = parse_version(spec[:-2])
        assert s is not None and op in ("==", "!=")
        return _prefix_match(v, s[0], s[1]) == (op == "==")
    s = parse_version(spec)
    assert s is not None
    if op in ("==", "!="):
        return (_key(v, local=bool(s[5])) == _key(s)) == (op == "==")
    have, want = _key(v, local=False), _key(s)
    same_base = have[:2] == want[:2]
    if op == "<=":
        return have <= want
    if op == ">=":
        return have >= want
    if op == "<":  # 2.0rc1 is not < 2.0
        return have < want and not (same_base and _is_pre(v) and not _is_pre(s))
    if op == ">":  # 2.0.post1 and 2.0+x are not > 2.0
        return have > want and not (same_base and (v[5] or (v[3] is not None and s[3] is None)))
    if op == "~=":
        return have >= want and _prefix_match(v, s[0], s[1][:-1])
    raise ValueError(f"unknown operator {op}")


# ---------------------------------------------------------------- pip: requirements


def normalise(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: str) -> Reply:
    """What a requirement asks for: ``name`` (normalised, or None), ``specs`` [(op,
    version)], ``exact`` (a wheel file's version), ``arg`` (for pip's command line) and
    ``known``: False when only pip can tell (a VCS URL, a source tree, bad syntax)."""
    import re

    text = text.strip()
    body = text.split(";", 1)[0].strip()  # environment markers: assumed true
    req: Reply = {"text": text, "arg": text, "name": None, "specs": [], "exact": None}
    req["known"] = False
    m = re.fullmatch(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)", body)
    rest = m.group(3).strip() if m else ""
    path_like = "/" in body or ":" in body or body.endswith((".whl", ".zip", ".tar.gz", ".tgz"))
    if m and rest.startswith("@"):  # name @ url (PEP 508)
        req["name"], location = normalise(m.group(1)), rest[1:].strip()
    elif m and not path_like:
        specs = []
        inner = rest.strip("()").strip()  # name (>=1,<2) is the old form of name>=1,<2
        for part in inner.split(",") if inner else []:
            sm = re.fullmatch(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*([^\s]+)\s*", part)
            if sm is None:
                return req
            op, version = sm.groups()
            wild = version.endswith(".*")
            parsed = parse_version(version[:-2] if wild else version)
            if op != "===" and (
                parsed is None
                or (wild and (op not in ("==", "!=") or parsed[2:] != (None, None, None, ())))
                or (op == "~=" and len(parsed[1]) < 2)
            ):
                return req
            specs.append((op, version))
        req.update(name=normalise(m.group(1)), specs=specs, known=True)
        return req
    else:
        location = body
        if location.startswith("~"):  # pip does not expand ~ itself
            req["arg"] = text.replace(location, _path(location), 1)
    if location.endswith(".whl"):  # name-version(-build)-python-abi-platform.whl
        if location.startswith("file:"):
            from urllib.parse import unquote, urlsplit

            location = unquote(urlsplit(location).path)
        parts = os.path.basename(location)[:-4].split("-")
        if len(parts) in (5, 6) and parse_version(parts[1]) is not None:
            req.update(name=normalise(parts[0]), exact=parts[1], known=True)
    return req


def read_requirements(path: str, depth: int = 0) -> list[str]:
    """The requirements of a requirements file, nested ``-r`` files included. Its option
    lines are left to pip: the file is handed to pip whole."""
    import re

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise Fail(f"cannot read the requirements file {path}: {exc.strerror}") from None
    found = []
    for raw in text.replace("\\\n", "").splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        nested = re.match(r"(-r|--requirement)[=\s]*(\S+)", line)
        if nested and depth < 10:
            found += read_requirements(
                os.path.join(os.path.dirname(path), nested.group(2)), depth + 1
            )
        elif line and (not line.startswith("-") or line.startswith(("-e", "--editable"))):
            found.append(line.split(" --", 1)[0].strip())  # minus options such as --hash
    return found


def satisfied(req: Reply, versions: dict[str, str]) -> bool:
    have = versions.get(req["name"] or "")
    if not req["known"] or have is None:
        return False
    if req["exact"] is not None:  # a wheel file: only its own version will do
        a, b = parse_version(have), parse_version(req["exact"])
        return have == req["exact"] if a is None or b is None else _key(a) == _key(b)
    return all(version_matches(have, op, spec) for op, spec in req["specs"])


# ---------------------------------------------------------------- pip: what is installed

_SITE_DIRS: dict[str, list[str]] = {}
# The interpreter's import path, in order: its site-packages, Debian's dist-packages,
# PYTHONPATH, and the user site where pip --user puts packages (in sys.path only once it
# exists, so put in its place here).
_SITE_QUERY = """
import json, os, site, sys
paths = [p for p in sys.path if p and os.path.isdir(p)]
user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
if user and user not in paths:
    system = [i for i, p in enumerate(paths) if p in getattr(site, "getsitepackages", list)()]
    paths.insert(system[0] if system else len(paths), user)
print(json.dumps(paths))
"""


def _site_dirs(python: str, venv: str | None) -> list[str]:
    if venv is not None:
        try:
            with open(os.path.join(venv, "pyvenv.cfg")) as f:
                shared = "include-system-site-packages = true" in f.read().lower()
        except OSError:
            shared = False
        if not shared:  # the venv alone: no need to start its interpreter
            import glob

            return sorted(
                glob.glob(os.path.join(glob.escape(venv), "lib", "python*", "site-packages"))
            )
    if python not in _SITE_DIRS:
        rc, out, err, _ = _run([python, "-c", _SITE_QUERY], timeout=60)
        if rc:
            raise Fail(f"cannot ask {python} for its packages: {_last_line(err) or rc}")
        _SITE_DIRS[python] = [str(p) for p in json.loads(out)]
    return _SITE_DIRS[python]


def scan(dirs: list[str]) -> tuple[dict[str, str], frozenset[str]]:
    """Installed distributions, normalised name -> metadata folder (the first on the path
    wins, as for imports), and every metadata folder seen (to tell whether pip changed
    anything). Names come from folder names: no file is read for the packages not asked
    about."""
    found: dict[str, str] = {}
    seen = set()
    for folder in dirs:
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            stem, _, kind = entry.rpartition(".")
            if kind not in ("dist-info", "egg-info"):
                continue
            path = os.path.join(folder, entry)
            seen.add(path)
            parts = stem.split("-")  # NAME-VERSION.dist-info, NAME-VERSION-pyX.Y.egg-info
            name = parts[0] if kind == "egg-info" or len(parts) < 2 else "-".join(parts[:-1])
            found.setdefault(normalise(name), path)
    return found, frozenset(seen)


def dist_version(path: str) -> str | None:
    """The Version header of a dist-info's METADATA (an egg-info's PKG-INFO)."""
    if os.path.isdir(path):
        path = os.path.join(path, "METADATA" if path.endswith(".dist-info") else "PKG-INFO")
    try:
        with open(path, "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    break  # the end of the headers
                if line.lower().startswith("version:"):
                    return line[8:].strip()
    except OSError:
        pass
    return None


def _versions(reqs: list[Reply], dists: dict[str, str]) -> dict[str, str]:
    versions = {}
    for name in sorted({r["name"] for r in reqs if r["name"] in dists}):
        version = dist_version(dists[name])
        if version is not None:
            versions[name] = version
    return versions


def _pip_command(executable: str | None) -> tuple[str, list[str]]:
    """(the interpreter whose packages pip manages, the pip command)."""
    if not executable:
        return sys.executable, [sys.executable, "-m", "pip"]
    exe = _path(executable)
    if os.sep not in exe:
        exe = _which(exe) or exe
    if not os.path.isfile(exe):
        raise Fail(f"pip executable {executable} not found")
    if os.path.basename(exe).startswith("python"):
        return exe, [exe, "-m", "pip"]
    return script_python(exe), [exe]


def script_python(script: str) -> str:
    """The interpreter a pip script runs, from its #! line."""
    import re

    with open(script, "rb") as f:
        head = f.read(1024).decode("utf-8", "replace")
    words = head.split("\n", 1)[0][2:].split() if head.startswith("#!") else []
    python = words[0] if words else None
    if python and os.path.basename(python) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        python = _which(words[0]) if words else None
    elif python and os.path.basename(python) in ("sh", "bash"):
        found = re.search(r"'''exec' \"?([^\"\s]+)", head)  # pip's launcher for long paths
        python = found.group(1) if found else None
    if not python:
        raise Fail(f"cannot tell which Python {script} runs: give that Python as executable")
    return python


def mod_pip(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import shlex

    state = str(args.get("state") or "present")
    if state not in ("present", "latest", "absent", "forcereinstall"):
        raise Fail(f"unsupported state {state!r}")
    named = [parse_requirement(str(n)) for n in args.get("name") or []]
    req_file = _path(args["requirements"]) if args.get("requirements") else None
    listed = [parse_requirement(t) for t in read_requirements(req_file)] if req_file else []
    if not named and req_file is None:
        raise Fail("pip needs name or requirements")
    wanted = named + listed
    reply: Reply = {"cmd": [], "rc": 0, "stdout": "", "stderr": "", "changed": False}
    env = dict(os.environ, PIP_NO_INPUT="1")
    env.update({str(k): str(v) for k, v in (args.get("environment") or {}).items()})
    venv = _path(args["virtualenv"]) if args.get("virtualenv") else None
    created = False
    if venv is not None:
        python = os.path.join(venv, "bin", "python")
        base = [python, "-m", "pip"]
        if not os.path.exists(python):
            created = True
            cmd = shlex.split(str(args.get("virtualenv_command") or "python3 -m venv"))
            cmd += ["--system-site-packages"] if args.get("virtualenv_site_packages") else []
            reply.update(cmd=[*cmd, venv], changed=True, python=python, installed={})
            if check:  # nothing is installed in a venv that does not exist yet
                reply.update(missing=[r["text"] for r in wanted], msg=f"would create {venv}")
                return reply
            rc, out, err, _ = _run([*cmd, venv], env=env)
            if rc:
                reply.update(rc=rc, stdout=out[-TAIL:], stderr=err[-TAIL:], changed=False)
                raise Fail(f"creating the virtualenv failed: {_last_line(err, out)}", **reply)
    else:
        python, base = _pip_command(args.get("executable"))
    dirs = _site_dirs(python, venv)
    dists, before = scan(dirs)
    versions = _versions(wanted, dists)
    for r in wanted:
        r["met"] = satisfied(r, versions)
    reply.update(python=python, installed=versions)
    reply["missing"] = [r["text"] for r in wanted if not r["met"]]
    extra = shlex.split(str(args.get("extra_args") or ""))
    if state == "absent":
        # What is installed and matches goes (by name alone when only pip can tell).
        gone = {r["name"] for r in wanted if r["name"] in versions and (r["met"] or not r["known"])}
        cmd = [*base, "uninstall", "-y", "--disable-pip-version-check", *extra, *sorted(gone)]
        cmd = cmd if gone else []
    else:
        cmd = [*base, "install", "--disable-pip-version-check"]
        if args.get("index_url"):
            cmd += ["--index-url", str(args["index_url"])]
        for url in _list(args.get("extra_index_url")):
            cmd += ["--extra-index-url", url]
        for link in _list(args.get("find_links")):
            cmd += ["--find-links", _path(link)]
        cmd += ["--no-index"] if args.get("no_index") else []
        cmd += extra
        if state == "present":  # only what is missing; the file whole if any of it is
            todo = [r["arg"] for r in named if not r["met"]]
            use_file = not all(r["met"] for r in listed)
        else:
            cmd.append("-U" if state == "latest" else "--force-reinstall")
            todo, use_file = [r["arg"] for r in named], True
        if req_file is not None and use_file:
            todo += ["-r", req_file]
        cmd = [*cmd, *todo] if todo else []
    if check or not cmd:
        # latest: what is missing will surely be installed; newer versions of the rest
        # cannot be told without asking the index.
        would = bool(reply["missing"]) if state == "latest" else bool(cmd)
        reply.update(cmd=cmd, changed=created or would)
        if check and state == "latest" and not would:
            reply["msg"] = "check mode cannot tell whether newer versions exist (it asks no index)"
        return reply
    rc, out, err, _ = _run(cmd, env=env)
    dists, after = scan(dirs)
    reply.update(
        cmd=cmd,
        rc=rc,
        stdout=out[-TAIL:],
        stderr=err[-TAIL:],
        installed=_versions(wanted, dists),
        changed=created or state == "forcereinstall" or after != before,
    )
    if rc:
        reply.update(failed=True, msg=_last_line(err, out) or f"pip exited with {rc}")
    return reply


# ---------------------------------------------------------------- setvars


def _sourced_env(shell: str, step: str, path: str) -> tuple[int, dict[str, str] | None, str]:
    """The environment after ``step`` in a fresh shell. The file is $f with no positional
    arguments: a sourced setvars.sh would read ours as its own options."""
    rc, out, err, timed_out = _run(
        [shell, "-c", f"f=$1; shift; {step}; echo {MARK}; env", "_", path], timeout=120
    )
    _, mark, tail = out.partition(MARK + "\n")
    if rc or timed_out or not mark:
        return rc, None, "timed out" if timed_out else _last_line(err)
    env: dict[str, str] = {}
    name = None
    for line in tail.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.isidentifier():
            name = key
            env[name] = value
        elif name is not None:  # a value with newlines
            env[name] += "\n" + line
    return rc, env, err


def mod_setvars(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    prefix = os.path.dirname(os.path.dirname(_path(args.get("python") or sys.executable)))
    candidates = [_path(p) for p in args.get("paths") or []]
    if args.get("search", True):
        candidates += [
            "/opt/intel/oneapi/setvars.sh",
            _path("~/intel/oneapi/setvars.sh"),
            os.path.join(prefix, "env", "setvars.sh"),  # oneccl_bind_pt and impi-rt wheels
            os.path.join(prefix, "env", "vars.sh"),
        ]
        if os.environ.get("ONEAPI_ROOT"):
            candidates.append(os.path.join(os.environ["ONEAPI_ROOT"], "setvars.sh"))
    tried = list(dict.fromkeys(candidates))
    path = next((p for p in tried if os.path.isfile(p)), None)
    reply: Reply = {"found": path is not None, "path": path, "sets": [], "changed": False}
    if path is None:
        msg = (
            f"no oneAPI environment script found (tried {', '.join(tried) or 'nothing'}): "
            "install oneAPI, or set cpuaccel_setvars to the file"
        )
        reply.update(failed=bool(args.get("required")), msg=msg, tried=tried)
        return reply
    shell = "/bin/bash" if os.path.exists("/bin/bash") else _which("bash") or "/bin/sh"
    _, plain, _ = _sourced_env(shell, ":", path)
    rc, env, why = _sourced_env(shell, '. "$f" >/dev/null', path)
    if env is None or plain is None:
        raise Fail(
            f"{path} cannot be sourced ({shell} exit {rc}{': ' + why if why else ''})", **reply
        )
    reply["sets"] = sorted(k for k, v in env.items() if plain.get(k) != v)
    if args.get("record"):
        record = _path(args["record"])
        try:
            with open(record, encoding="utf-8") as f:
                current: str | None = f.read()
        except OSError:
            current = None
        if current != path + "\n":
            reply["changed"] = True
            if not check:
                os.makedirs(os.path.dirname(record) or ".", exist_ok=True)
                _write_atomic(record, (path + "\n").encode(), None)
    return reply


# ---------------------------------------------------------------- the request loop

MODULES: dict[str, Handler] = {
    "command": mod_command,
    "file": mod_file,
    "copy": mod_copy,
    "stat": mod_stat,
    "pip": mod_pip,
    "setvars": mod_setvars,
}


def handle(request: dict[str, Any]) -> Reply:
    """One request's reply; whatever goes wrong becomes a failed reply, never an exit."""
    reply: Reply = {"id": request.get("id"), "changed": False, "failed": False}
    handler = MODULES.get(str(request.get("module")))
    try:
        if handler is None:
            raise Fail(f"unknown module {request.get('module')}")
        result = handler(
            dict(request.get("args") or {}), bool(request.get("check")), bool(request.get("diff"))
        )
    except Fail as exc:
        result = {**exc.fields, "failed": True, "msg": exc.msg}
    except Exception as exc:
        result = {"failed": True, "msg": f"{type(exc).__name__}: {exc}"}
    reply.update(result)
    return reply


def main() -> None:
    # Replies get a private copy of stdout; fd 1 itself becomes stderr, so that nothing
    # else (a stray print, a child that inherits fd 1) can break the line protocol.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: Reply) -> None:
        out.write(json.dumps(message, default=str) + "\n")
        out.flush()

    version = ".".join(str(p) for p in sys.version_info[:3])
    send({"ready": True, "python": sys.executable, "version": version})
    while True:
        line = sys.stdin.buffer.readline()  # the buffer BOOT read the source from
        if not line:
            return
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            send({"id": None, "changed": False, "failed": True, "msg": f"bad request: {exc}"})
            continue
        send(handle(request))


if __name__ == "__main__":
    main()
