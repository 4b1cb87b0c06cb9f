"""The pip module: compare what is installed first, run pip only for what is missing."""

from __future__ import annotations

import os
import sys

from cpuaccel.node.boundedjson import loads
from cpuaccel.node.common import dist_infos, which
from cpuaccel.node.moduleutil import TAIL, Fail, as_list, expand, last_line, run
from cpuaccel.node.pep440 import (
    parse_requirement,
    read_requirements,
    satisfied,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cpuaccel.node.moduleutil import Reply


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
        rc, out, err, _ = run([python, "-c", _SITE_QUERY], timeout=60)
        if rc:
            raise Fail(f"cannot ask {python} for its packages: {last_line(err) or rc}")
        _SITE_DIRS[python] = [str(p) for p in loads(out)]
    return _SITE_DIRS[python]


def scan(dirs: list[str]) -> tuple[dict[str, str], frozenset[str]]:
    """Installed distributions, normalised name -> metadata folder (the first on the path
    wins, as for imports), and every metadata folder seen (to tell whether pip changed
    anything). Names come from folder names: no file is read for the packages not asked
    about."""
    found: dict[str, str] = {}
    seen = set()
    for name, _, path in dist_infos(dirs):
        seen.add(path)
        found.setdefault(name, path)
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
    exe = expand(executable)
    if os.sep not in exe:
        exe = which(exe) or exe
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
        python = which(words[0]) if words else None
    elif python and os.path.basename(python) in ("sh", "bash"):
        found = re.search(r"'''exec' \"?([^\"\s]+)", head)  # pip's launcher for long paths
        python = found.group(1) if found else None
    if not python:
        raise Fail(f"cannot tell which Python {script} runs: give that Python as executable")
    return python


def _pip_argv(
    state: str,
    base: list[str],
    args: dict[str, Any],
    named: list[dict[str, Any]],
    listed: list[dict[str, Any]],
    req_file: str | None,
    versions: dict[str, str],
) -> list[str]:
    """pip's command for what is not as wanted (each requirement's "met" set); [] when
    there is nothing to do."""
    import shlex

    extra = shlex.split(str(args.get("extra_args") or ""))
    if state == "absent":
        # What is installed and matches goes (by name alone when only pip can tell).
        gone = {
            r["name"]
            for r in named + listed
            if r["name"] in versions and (r["met"] or not r["known"])
        }
        cmd = [*base, "uninstall", "-y", "--disable-pip-version-check", *extra, *sorted(gone)]
        return cmd if gone else []
    cmd = [*base, "install", "--disable-pip-version-check"]
    if args.get("index_url"):
        cmd += ["--index-url", str(args["index_url"])]
    for url in as_list(args.get("extra_index_url")):
        cmd += ["--extra-index-url", url]
    for link in as_list(args.get("find_links")):
        cmd += ["--find-links", expand(link)]
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
    return [*cmd, *todo] if todo else []


def _requirements(args: dict[str, Any]) -> tuple[list[Reply], list[Reply], str | None]:
    """The requirements named, those of the requirements file, and that file."""
    named = [parse_requirement(str(n)) for n in args.get("name") or []]
    req_file = expand(args["requirements"]) if args.get("requirements") else None
    listed = [parse_requirement(t) for t in read_requirements(req_file)] if req_file else []
    if not named and req_file is None:
        raise Fail("pip needs name or requirements")
    return named, listed, req_file


def mod_pip(args: dict[str, Any], check: bool, diff: bool) -> Reply:
    import shlex

    state = str(args.get("state") or "present")
    if state not in ("present", "latest", "absent", "forcereinstall"):
        raise Fail(f"unsupported state {state!r}")
    named, listed, req_file = _requirements(args)
    wanted = named + listed
    reply: Reply = {"cmd": [], "rc": 0, "stdout": "", "stderr": "", "changed": False}
    env = dict(os.environ, PIP_NO_INPUT="1")
    env.update({str(k): str(v) for k, v in (args.get("environment") or {}).items()})
    venv = expand(args["virtualenv"]) if args.get("virtualenv") else None
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
            rc, out, err, _ = run([*cmd, venv], env=env)
            if rc:
                reply.update(rc=rc, stdout=out[-TAIL:], stderr=err[-TAIL:], changed=False)
                raise Fail(f"creating the virtualenv failed: {last_line(err, out)}", **reply)
    else:
        python, base = _pip_command(args.get("executable"))
    dirs = _site_dirs(python, venv)
    dists, before = scan(dirs)
    versions = _versions(wanted, dists)
    for r in wanted:
        r["met"] = satisfied(r, versions)
    reply.update(python=python, installed=versions)
    reply["missing"] = [r["text"] for r in wanted if not r["met"]]
    cmd = _pip_argv(state, base, args, named, listed, req_file, versions)
    if check or not cmd:
        # latest: what is missing will surely be installed; newer versions of the rest
        # cannot be told without asking the index.
        would = bool(reply["missing"]) if state == "latest" else bool(cmd)
        reply.update(cmd=cmd, changed=created or would)
        if check and state == "latest" and not would:
            reply["msg"] = "check mode cannot tell whether newer versions exist (it asks no index)"
        return reply
    rc, out, err, _ = run(cmd, env=env)
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
        reply.update(failed=True, msg=last_line(err, out) or f"pip exited with {rc}")
    return reply
