"""How each module runs for one host, given its rendered, normalised arguments.

Node-side modules become one request to the host's agent; ``copy`` and ``template``
read and render on the controller (as Ansible does) and send bytes with their
checksum (a large ``copy`` source is named by its sha1 first: a node that holds it is
sent nothing); ``synchronize`` is the connector's rsync from the controller; the rest
never leave it.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import posixpath
import shlex
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpuaccel import templating
from cpuaccel.errors import CpuaccelError
from cpuaccel.node.moduleutil import sha1_file
from cpuaccel.playbook import templar
from cpuaccel.playbook.modules import find_source, search_path
from cpuaccel.playbook.session import HostContext as HostContext  # re-exported
from cpuaccel.playbook.session import Result as Result


class ActionError(CpuaccelError):
    """The task cannot run on this host as written (missing src, bad rendered value)."""


def _process_request(args: dict[str, Any]) -> dict[str, Any]:
    """What command and shell share: creates/removes, chdir, environment, stdin, timeout."""
    keys = ("creates", "removes", "chdir", "environment", "stdin")
    request = {k: args[k] for k in keys if args.get(k) is not None}
    if args.get("timeout") is not None:
        request["timeout"] = float(args["timeout"])
    return request


def _command(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    request = _process_request(args)
    if args.get("argv"):
        request["argv"] = [str(a) for a in args["argv"]]
    elif args.get("cmd"):
        try:
            request["argv"] = shlex.split(str(args["cmd"]))
        except ValueError as exc:
            raise ActionError(f"cannot split the command line: {exc}") from None
    else:
        raise ActionError("command needs cmd (free form) or argv")
    return ctx.request("command", request)


def _shell(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    request = _process_request(args)
    request.update(cmd=str(args["cmd"]), shell=True, executable=args.get("executable") or "/bin/sh")
    return ctx.request("command", request)


def _passthrough(module: str) -> Callable[[HostContext, dict[str, Any], Mapping[str, Any]], Result]:
    def action(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
        return ctx.request(module, {k: v for k, v in args.items() if v is not None})

    return action


def _send_bytes(ctx: HostContext, data: bytes, dest: str, args: Mapping[str, Any]) -> Result:
    request: dict[str, Any] = {
        "dest": dest,
        "content_b64": base64.b64encode(data).decode(),
        "checksum": hashlib.sha1(data).hexdigest(),
        "force": args.get("force", True),
    }
    if args.get("mode") is not None:
        request["mode"] = args["mode"]
    return ctx.request("copy", request)


def _copy(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    dest = str(args["dest"])
    if args.get("content") is not None:
        content = args["content"]
        data = content.encode() if isinstance(content, str) else templar.to_text(content).encode()
        return _send_bytes(ctx, data, dest, args)
    path = copy_source(ctx, args)
    dest = copy_dest(args, path)
    delivered, ctx.broadcast = ctx.broadcast, []  # the file, by broadcast before the task
    size = path.stat().st_size
    if size >= PROBE_BYTES:  # the node first says whether it needs the bytes at all
        probe: dict[str, Any] = {
            "dest": dest,
            "probe": True,
            "checksum": source_sha1(path),
            "size": size,
            "force": args.get("force", True),
        }
        if args.get("mode") is not None:
            probe["mode"] = args["mode"]
        said = ctx.request("copy", probe)
        if not said.get("wants_content"):
            return {**said, "changed": True, "broadcast": delivered} if delivered else said
    return _send_bytes(ctx, path.read_bytes(), dest, args)


# A copy source of this size or more is named by its sha1 before its bytes are sent: a
# node that holds it already (a re-run, or a broadcast before the task) is sent nothing.
PROBE_BYTES = 1 << 20
_sha1s: dict[tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime_ns) -> sha1
_sha1s_lock = threading.Lock()


def copy_source(ctx: HostContext, args: Mapping[str, Any]) -> Path:
    """The controller file a ``copy`` task's ``src`` names, looked for as Ansible does."""
    src = str(args["src"])
    path = find_source(src, ctx.playbook_dir, "files")
    if path is None or not path.is_file():
        tried = ", ".join(str(p) for p in search_path(src, ctx.playbook_dir, "files"))
        raise ActionError(f"copy: src {src!r} is not a file on the controller (looked in {tried})")
    return path


def copy_dest(args: Mapping[str, Any], source: Path) -> str:
    """Where a ``copy`` task of ``source`` writes: a dest ending in '/' takes its name."""
    dest = str(args["dest"])
    return posixpath.join(dest, source.name) if dest.endswith("/") else dest


def source_sha1(path: Path) -> str:
    """The sha1 of a copy source, hashed once for all the task's hosts."""
    info = path.stat()
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
    with _sha1s_lock:
        if key not in _sha1s:
            _sha1s[key] = sha1_file(str(path))[0]
        return _sha1s[key]


def _template(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    src = str(args["src"])
    path = find_source(src, ctx.playbook_dir, "templates")
    if path is None or not path.is_file():
        tried = ", ".join(str(p) for p in search_path(src, ctx.playbook_dir, "templates"))
        raise ActionError(f"template {src!r} not found on the controller (looked in {tried})")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ActionError(f"cannot read template {path}: {exc}") from None
    try:
        rendered = templating.render_text(text, {**variables, "template_path": str(path)})
    except templating.TemplateError as exc:
        raise ActionError(f"template {path}: {exc.message}", hint=exc.hint) from None
    dest = str(args["dest"])
    if dest.endswith("/"):
        dest = posixpath.join(dest, path.name.removesuffix(".j2"))
    return _send_bytes(ctx, rendered.encode(), dest, args)


def _pip(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    names = list(args.get("name") or [])
    if args.get("version"):
        if len(names) != 1:
            raise ActionError("pip: version needs exactly one name")
        names = [f"{names[0]}=={args['version']}"]
    if not names and not args.get("requirements"):
        raise ActionError("pip: give name or requirements")
    # An empty value means "not given": playbooks compute optional arguments in Jinja.
    request = {
        k: v for k, v in args.items() if v not in (None, "", []) and k not in ("version", "timeout")
    }
    request["name"] = names
    request.setdefault("state", "present")
    return ctx.request("pip", request)


def _synchronize(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    """rsync from the controller: the way a wheelhouse reaches offline nodes."""
    ctx.as_ssh_user("synchronize")
    src = Path(str(args["src"])).expanduser()
    if not src.exists():
        raise ActionError(f"synchronize: src {src} does not exist on the controller")
    dest = str(args["dest"])
    if _deletes(args):
        verdict = ctx.request("destination", {"path": dest, "workdir": ctx.host.workdir})
        if verdict.get("failed") or verdict.get("refused"):
            why = verdict.get("refused") or verdict.get("msg")
            msg = (
                f"synchronize: refusing to delete in dest {dest} (on the node: "
                f"{verdict.get('dest')}): {why}; choose a folder of its own for dest, "
                "as for cpuaccel sync --delete"
            )
            return {"failed": True, "changed": False, "msg": msg}
        # rsync then deletes in the very folder judged (~ and links resolved there).
        dest = str(verdict["dest"]) + ("/" if dest.endswith("/") else "")
    # Files a broadcast across the task's hosts put in place just before (each checked
    # by sha256 on the node, with the source's mode and mtime): rsync finds them equal.
    delivered, ctx.broadcast = ctx.broadcast, []
    recheck, ctx.recheck = ctx.recheck, False
    if src.is_dir() and not recheck and _unchanged_tree(ctx, src, dest, args):
        done = {"changed": False, "failed": False, "items": [], "count": 0}
        return {**done, "changed": True, "broadcast": delivered} if delivered else done
    # --mkpath: dest's parents may be made by an earlier task, which --check did not run.
    flags = ["-a", "--mkpath", "--out-format=%i %n"]
    if ctx.check:
        flags.append("--dry-run")
    if recheck:
        flags.append("--checksum")
    if args.get("delete"):
        flags.append("--delete")
    flags += [str(o) for o in args.get("rsync_opts") or []]
    source = str(src) + ("/" if src.is_dir() else "")
    result = ctx.connect().rsync(flags, source, dest)
    if not result.ok:
        msg = f"rsync: {result.error}"
        return {"failed": True, "changed": False, "rc": result.exit_code, "msg": msg}
    # rsync itemizes only what differs; "cd+++" of dest itself counts as a change too.
    items = [line for line in result.lines if line.strip()]
    out = {"changed": bool(items), "failed": False, "items": items[:200], "count": len(items)}
    return {**out, "changed": True, "broadcast": delivered} if delivered else out


def _deletes(args: Mapping[str, Any]) -> bool:
    """delete: true, or an rsync option that deletes on the receiver (--del,
    --delete-after, --delete-excluded ...): each is judged like cpuaccel sync --delete."""
    opts = [str(o).split("=", 1)[0] for o in args.get("rsync_opts") or []]
    return bool(args.get("delete")) or any(o == "--del" or o.startswith("--delete") for o in opts)


def listing(root: Path, excludes: list[str]) -> dict[str, list[int]]:
    """The controller's side of the node's ``tree`` listing (see node/files.py)."""
    out: dict[str, list[int]] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not _excluded(d, excludes)]
        for name in dirs + [n for n in names if not _excluded(n, excludes)]:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            rel = os.path.relpath(path, root)
            is_dir = stat.S_ISDIR(st.st_mode)
            out[rel] = [-1, 0, mode] if is_dir else [st.st_size, int(st.st_mtime), mode]
    return out


def _excluded(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def plain_excludes(args: Mapping[str, Any]) -> list[str] | None:
    """The names rsync_opts' plain --exclude=NAME options leave out, or None when any
    other option is there (then only rsync knows what it sends)."""
    excludes: list[str] = []
    for opt in args.get("rsync_opts") or []:
        if not str(opt).startswith("--exclude=") or "/" in str(opt):
            return None
        excludes.append(str(opt).removeprefix("--exclude="))
    return excludes


def _unchanged_tree(ctx: HostContext, src: Path, dest: str, args: Mapping[str, Any]) -> bool:
    """True when the node's copy already matches (sizes, times, modes), as rsync -a's
    own quick check would find, asked over the open connection: a no-op push then costs
    one message instead of an ssh handshake per node. Only plain --exclude options are
    understood; any other rsync option means rsync decides."""
    excludes = plain_excludes(args)
    if excludes is None:
        return False
    there = ctx.request("tree", {"path": dest.rstrip("/") or "/"})
    if there.get("failed") or not there.get("exists"):
        return False
    remote: dict[str, list[int]] = there.get("files") or {}
    local = listing(src, excludes)
    if any(remote.get(rel) != entry for rel, entry in local.items()):
        return False
    # Without --delete, extra files on the node stay; with it, only excluded ones may.
    extra = [rel for rel in remote if rel not in local]
    return not args.get("delete") or all(_excluded(posixpath.basename(r), excludes) for r in extra)


def _assert(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    for expr in args["that"]:
        if not templar.condition(str(expr), variables):
            msg = args.get("fail_msg") or f"Assertion failed: {expr}"
            return {"failed": True, "changed": False, "msg": str(msg), "assertion": str(expr)}
    return {
        "failed": False,
        "changed": False,
        "msg": args.get("success_msg") or "All assertions passed",
    }


def _fail(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    return {"failed": True, "changed": False, "msg": str(args["msg"])}


def _debug(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    if args.get("var"):
        value = templar.evaluate(str(args["var"]), variables)
        return {
            "changed": False,
            "failed": False,
            str(args["var"]): value,
            "msg": templar.to_text(value),
        }
    msg = args.get("msg", "Hello world!")
    return {
        "changed": False,
        "failed": False,
        "msg": msg if isinstance(msg, str) else templar.to_text(msg),
    }


def _set_fact(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    return {"changed": False, "failed": False, "ansible_facts": dict(args)}


def _alike(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    """Gather this host's facts with the given Python; ``finish_alike`` compares hosts."""
    from cpuaccel.facts.gather import gather

    python = str(args.get("python") or ctx.host.python)
    ctx.as_ssh_user("alike")
    facts = gather(ctx.connect(), python=python)
    return {"changed": False, "failed": False, "facts": facts}


def self_requirements() -> list[str]:
    """cpuaccel's own dependencies (no extras): the self wheel needs them on the node."""
    import importlib.metadata

    requires = importlib.metadata.requires("cpuaccel") or []
    return [r for r in requires if "extra ==" not in r and "extra==" not in r]


def controller_pins(names: Sequence[Any]) -> list[str]:
    """``NAME==VERSION`` of each package as the controller has it installed (those it
    has not are left out): what must be the same on the nodes as here, e.g. cloudpickle,
    which a notebook's function is pickled with on the controller and read with on
    every rank."""
    import importlib.metadata

    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={importlib.metadata.version(str(name))}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def _wheelhouse(ctx: HostContext, args: dict[str, Any], variables: Mapping[str, Any]) -> Result:
    """Wheels for offline nodes, filled on the controller (which can reach an index)."""
    from cpuaccel.playbook import wheels

    dest = Path(str(args["dest"])).expanduser()
    requirements = list(args.get("requirements") or [])
    if args.get("include_self"):
        requirements += self_requirements()
    pinned = controller_pins(args.get("same_as_controller") or [])
    requirements += pinned
    constraints = Path(str(args["constraints"])).expanduser() if args.get("constraints") else None
    filled = (
        wheels.fill_wheelhouse(
            dest,
            requirements,
            constraints=constraints,
            extra_index_urls=[str(u) for u in args.get("extra_index_url") or []],
        )
        if requirements
        else None
    )
    result: Result = {
        "changed": bool(filled and filled.changed),
        "failed": False,
        "path": str(dest),
        "files": list(filled.files) if filled else [],
        "pinned": pinned,
    }
    if args.get("include_self"):
        # Its own folder: the self wheel changes with every code change, and must not
        # invalidate the stamp that lets an unchanged wheelhouse skip pip.
        own = dest / "cpuaccel"
        own.mkdir(parents=True, exist_ok=True)
        before = set(own.glob("cpuaccel-*.whl"))
        wheel = wheels.build_self_wheel(own)
        result["changed"] |= wheel not in before
        for old in own.glob("cpuaccel-*.whl"):
            if old != wheel:
                old.unlink()
                result["changed"] = True
        result["self_wheel"] = f"cpuaccel/{wheel.name}"
    return result


Action = Callable[[HostContext, dict[str, Any], Mapping[str, Any]], Result]

ACTIONS: dict[str, Action] = {
    "command": _command,
    "shell": _shell,
    "file": _passthrough("file"),
    "stat": _passthrough("stat"),
    "setvars": _passthrough("setvars"),
    "copy": _copy,
    "template": _template,
    "pip": _pip,
    "synchronize": _synchronize,
    "assert": _assert,
    "fail": _fail,
    "debug": _debug,
    "set_fact": _set_fact,
    "wheelhouse": _wheelhouse,
    "alike": _alike,
}


def finish_alike(results: dict[str, Result], args_by_host: Mapping[str, Mapping[str, Any]]) -> None:
    """Fail every host whose versions differ from the majority (check's drift rules)."""
    from cpuaccel.facts.problems import ERROR, drift

    facts = {
        name: r["facts"] for name, r in results.items() if not r.get("failed") and "facts" in r
    }
    wanted: set[str] = set()
    for args in args_by_host.values():
        wanted.update(str(p) for p in args.get("packages") or [])
    problems = drift(facts)
    for name, result in results.items():
        mine = [p for p in problems if p.host == name and p.severity == ERROR]
        result["versions"] = {
            "python": (result.get("facts") or {}).get("python", {}).get("version"),
            **{
                k: v
                for k, v in ((result.get("facts") or {}).get("packages") or {}).items()
                if not wanted or k in wanted
            },
        }
        result.pop("facts", None)
        if mine:
            result.update(failed=True, msg="; ".join(p.message for p in mine))


FINISHERS: dict[str, Callable[[dict[str, Result], Mapping[str, Mapping[str, Any]]], None]] = {
    "alike": finish_alike,
}
