"""The declared type of every inventory variable cpuaccel reads: ``VARIABLES``, and
``Declared``, how a layer above declares the variables of its own.

A value reaches an argv, a rendered shell script, an ssh option or a path on a node, so
each has a type, checked when the inventory (and ``-e``) loads (``builder.validate``),
for every host and every verb: ``cpuaccel_ppn: four`` or ``ansible_host_key_checking:
ture`` is then one error naming the line that wrote it, before anything connects.
The run settings' variables (``cpuaccel_ppn``, ``cpuaccel_master_port`` ...) are declared
in config/settings.py's table, with the kind that checks them; the config layer hands
them to :meth:`Inventory.check_declared <cpuaccel.inventory.inventory.Inventory.check_declared>`
when it loads an inventory, and they are checked as these are.

A check takes the value and returns it converted, or raises :class:`BadValue` with the
complaint (the caller adds where it was written). None means "not set" and is never
checked.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from cpuaccel.rank_settings import value_problem

# An MPI hostfile's slots (inventory/hostfile.py): --ppn's last source (config/effective.py).
SLOTS_VAR = "cpuaccel_slots"
# YAML 1.1's and Ansible's boolean words (ansible.module_utils.parsing.convert_bool).
TRUE_WORDS = frozenset({"true", "yes", "on", "1", "y", "t"})
FALSE_WORDS = frozenset({"false", "no", "off", "0", "n", "f"})
# A shell variable name: anything else is code once written as `export NAME=...`.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names whose value is a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, wandb_api_key): see
# secret_value_problem.
SECRET_NAME = re.compile("TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
# Host names (letters, digits, '.', '-', '_' as Ansible aliases use it); never a leading
# '-', which ssh and rsync would read as an option.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
# An IPv6 address's scope id (fe80::1%eth0): an interface's name or number. Python's
# ipaddress takes any characters after the '%', a newline or a ';' included, and an
# address is written into the job's shell scripts and hostfile: only these are taken.
SCOPE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# A login name: no space, no control character, no leading '-' (an ssh option).
USER_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@$-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Check = Callable[[Any], Any]


class Declared(NamedTuple):
    """A variable declared by a layer above the inventory: its check, and the fix of a
    bad value (None: "fix the value of NAME")."""

    check: Check
    hint: str | None = None


class BadValue(ValueError):
    """A value of the wrong type; ``key`` names the bad key of a mapping value, ``hint``
    the fix when it is not the variable's usual one (:func:`hint_for`)."""

    def __init__(self, message: str, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.hint = hint


def parse_bool(value: Any) -> bool | None:
    """True or False for a YAML/Ansible boolean spelling (any case), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    word = str(value).strip().lower() if isinstance(value, str) else None
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def boolean(value: Any) -> bool:
    parsed = parse_bool(value)
    if parsed is None:
        raise BadValue(f"must be true or false (or yes/no, on/off, 1/0), got {value!r}")
    return parsed


def whole(low: int, high: int | None = None) -> Check:
    def check(value: Any) -> int:
        text = str(value).strip()
        if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()):
            raise BadValue(f"must be a whole number, got {value!r}")
        number = int(text)
        if number < low or (high is not None and number > high):
            upper = f" to {high}" if high is not None else " or more"
            raise BadValue(f"must be {low}{upper}, got {number}")
        return number

    return check


def choice(options: tuple[str, ...], *, fold: bool = False) -> Check:
    def check(value: Any) -> str:
        word = str(value).strip().lower() if fold else str(value)
        if isinstance(value, (bool, list, dict)) or word not in options:
            raise BadValue(f"is {value!r}; use one of {', '.join(options)}")
        return word

    return check


def text(value: Any) -> str | None:
    """A plain value (a path, a name): a string or number on one line; empty is unset."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadValue(f"must be a plain string, got {type(value).__name__} {value!r}")
    if _CONTROL.search(str(value)):
        raise BadValue(f"must be one line without control characters, got {value!r}")
    return str(value) if str(value) else None


def ssh_args(value: Any) -> str | None:
    """ssh arguments as Ansible passes them: words a shell would split (quotes closed)."""
    line = text(value)
    try:
        shlex.split(line or "")
    except ValueError as exc:
        raise BadValue(f"cannot be split into words: {exc}") from None
    return line


def env_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be an environment variable's name, or None."""
    if isinstance(name, str) and ENV_NAME.fullmatch(name):
        return None
    return f"{name!r} is not a variable name (letters, digits and '_', not starting with a digit)"


def secret_value_problem(name: str) -> str | None:
    """Why ``name`` cannot be given its value in the ranks' plain environment, or None:
    the one rule for ``--env NAME=VALUE`` (run, submit, tune, config show), an
    inventory's or ``-e``'s ``cpuaccel_env`` and a project file's ``env``.

    A name holding TOKEN, KEY, SECRET or PASSWORD (any case) is taken for a credential.
    The plain environment is printed (config show, run --dry-run), kept in env.sh on
    every node and written into a batch script; a credential reaches the ranks only
    through secret.env (0600 on the nodes, removed by the sweep): ``--env NAME`` with
    the value in the controller's environment, or ``cpuaccel_secret_env``."""
    if SECRET_NAME.search(name) is None:
        return None
    return (
        f"{name} looks like a credential (TOKEN, KEY, SECRET or PASSWORD in its name): "
        "a secret's value would be written into the run's files and printed"
    )


def secret_value_hint(name: str) -> str:
    """The fix for :func:`secret_value_problem`'s refusal."""
    return (
        f"export {name} here and pass --env {name} (no '='), or set it in the inventory's "
        f"cpuaccel_secret_env: either way its value goes only to secret.env on the nodes"
    )


def env_mapping(value: Any) -> dict[str, str]:
    """``NAME: value`` lines for the ranks' plain environment (``cpuaccel_env``, a
    project file's ``env``): names a shell accepts, plain values (a boolean as YAML
    wrote it), no credential (:func:`secret_value_problem`)."""
    result = _env_lines(value)
    for key in result:
        problem = secret_value_problem(key)
        if problem is not None:
            raise BadValue(problem, key=key, hint=secret_value_hint(key))
    return result


def secret_env_mapping(value: Any) -> dict[str, str]:
    """``cpuaccel_secret_env``'s ``NAME: value`` lines: as :func:`env_mapping`'s, any
    name (they go only to secret.env)."""
    return _env_lines(value)


def _env_lines(value: Any) -> dict[str, str]:
    if value is None or value == "" or value == {}:
        return {}
    if not isinstance(value, Mapping):
        # Not the value itself: it may be cpuaccel_secret_env's.
        raise BadValue(f"must be a mapping of NAME: value lines, got {type(value).__name__}")
    result: dict[str, str] = {}
    for key, item in value.items():
        problem = env_name_problem(key)
        if problem is not None:
            raise BadValue(problem, key=str(key))
        if item is None or isinstance(item, (dict, list)):
            raise BadValue(f"{key}: the value must be a plain string or number", key=key)
        result[key] = str(item).lower() if isinstance(item, bool) else str(item)
        problem = value_problem(key, result[key])  # a CPUACCEL_* the ranks would refuse
        if problem is not None:
            raise BadValue(f"{key}: {problem}", key=key)
    return result


def scope_id_problem(address: str) -> str | None:
    """Why the IPv6 scope id of ``address`` (what follows its '%') is refused, or None
    when it has none or one of :data:`SCOPE_ID`."""
    _, percent, scope = address.partition("%")
    if not percent or SCOPE_ID.fullmatch(scope):
        return None
    return (
        f"{address!r} has the IPv6 scope id {scope!r}: use an interface's name or number "
        "after the '%' (letters, digits, '.', '-' and '_')"
    )


def host_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a host's name or address, or None. Every host name and
    address cpuaccel takes (inventories, hostfiles, ``-i a,b,``, Slurm's node lists,
    ``ansible_host``) is checked here, as each is written into the job's files."""
    text_ = str(name)
    if isinstance(name, str) and HOST_NAME.fullmatch(text_):
        return None
    try:
        ipaddress.ip_address(text_)
    except ValueError:
        lead = " and must not start with '-'" if text_.startswith("-") else ""
        return (
            f"{text_!r} is not a host name or IP address: use letters, digits, '.', '-' "
            f"and '_'{lead}"
        )
    return scope_id_problem(text_)


def folder(value: Any) -> str | None:
    """A folder on the nodes that cpuaccel writes below (the workdir): absolute or in the
    login folder (``~/...``), with no ``..``. A relative path would be resolved from
    wherever each node's login lands, and ``..`` climbs out of what was meant (a
    workdir of ``../../etc`` would put a run's files in /etc)."""
    path = text(value)
    if path is None:
        return None
    if not (path == "~" or path.startswith(("/", "~/"))):
        raise BadValue(f"must be an absolute path or one below ~/, got {path!r}")
    if ".." in path.split("/"):
        raise BadValue(f"must not climb with '..', got {path!r}")
    return path


# An interface name as the kernel takes it (IFNAMSIZ: 15 bytes), no '/' or blank, and
# not starting with '-': it reaches mpirun's words (MPICH's -iface NAME).
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:@][A-Za-z0-9_.:@-]{0,14}")
NETWORK_WORDS = "a network in CIDR form (10.1.0.0/16) or an interface name (eth1)"


def network(value: Any) -> str | None:
    """``cpuaccel_network``: the network the job's ranks talk over, as a CIDR (normalised:
    ``10.1.2.3/16`` is ``10.1.0.0/16``) or an interface name."""
    word = text(value)
    if word is None:
        return None
    word = word.strip()
    if "/" in word:
        try:
            return str(ipaddress.IPv4Network(word, strict=False))
        except ValueError:
            raise BadValue(f"is not an IPv4 network in CIDR form, got {word!r}") from None
    if not INTERFACE_NAME.fullmatch(word) or word.replace(".", "").isdigit():
        raise BadValue(f"must be {NETWORK_WORDS}, got {word!r}")
    return word


def secret(value: Any) -> str | None:
    """A password sudo reads as one line; the complaint never shows the value."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadValue(f"must be a plain string, not a {type(value).__name__}")
    if _CONTROL.search(str(value)):
        raise BadValue("must be one line without control characters (its value is not shown)")
    return str(value) if str(value) else None


SUDO_FLAGS = ("-H", "-S", "-n")  # what cpuaccel passes to sudo itself, as it decides


def sudo_flags(value: Any) -> str | None:
    """Ansible's become_flags: only the flags cpuaccel uses anyway (its default)."""
    line = ssh_args(value)
    other = [word for word in shlex.split(line or "") if word not in SUDO_FLAGS]
    if other:
        raise BadValue(
            f"has {other[0]!r}: cpuaccel runs sudo with -H and -S (a password) or -n (none) "
            "itself, and takes no other flags"
        )
    return line


def sudo_exe(value: Any) -> str | None:
    path = text(value)
    if path is not None and path.rsplit("/", 1)[-1] != "sudo":
        raise BadValue(f"is {path!r}: cpuaccel runs the node's sudo (from its PATH) only")
    return path


def host_address(value: Any) -> str:
    problem = host_name_problem(value)
    if problem is not None:
        raise BadValue(problem)
    return str(value)


def user_name_problem(value: Any) -> str | None:
    if not isinstance(value, bool) and USER_NAME.fullmatch(str(value)):
        return None
    return (
        f"{value!r}, not a login name (letters, digits, '.', '-', '_'; no spaces, "
        "not starting with '-')"
    )


def user_name(value: Any) -> str:
    problem = user_name_problem(value)
    if problem is not None:
        raise BadValue(f"is {problem}")
    return str(value)


# Every variable cpuaccel's code reads, with its type, but the run settings' (declared
# with them, in config/settings.py). (Playbooks read their own variables through Jinja:
# those are the playbook's to check.)
VARIABLES: dict[str, Check] = {
    "ansible_host": host_address,
    "ansible_ssh_host": host_address,
    "ansible_user": user_name,
    "ansible_ssh_user": user_name,
    "ansible_host_key_checking": boolean,
    "ansible_ssh_private_key_file": text,
    "ansible_private_key_file": text,
    "ansible_python_interpreter": text,
    "ansible_ssh_common_args": ssh_args,
    "ansible_ssh_extra_args": ssh_args,
    # become (playbook/become.py): only sudo; the password is a secret (builder.SECRET_VARS).
    "ansible_become": boolean,
    "ansible_become_user": user_name,
    "ansible_become_method": choice(("sudo", "ansible.builtin.sudo")),
    "ansible_become_password": secret,
    "ansible_become_pass": secret,
    "ansible_sudo_pass": secret,  # the sudo plugin's old names, as Ansible still reads them
    "ansible_sudo_user": user_name,
    "ansible_become_flags": sudo_flags,
    "ansible_sudo_flags": sudo_flags,
    "ansible_become_exe": sudo_exe,
    "ansible_sudo_exe": sudo_exe,
    "cpuaccel_setvars": text,
    "cpuaccel_known_hosts": text,
    # false: check and sync reach the host with paramiko, not a kept OpenSSH master
    # (connectors/choose.keeps_connection).
    "cpuaccel_ssh_persist": boolean,
    "cpuaccel_slurm_job": whole(1),  # the Slurm job an allocated node is reached in
    # Slurm's view of a node of -i slurm:PARTITION (inventory/slurm_source.py), which
    # check shows and by which it leaves a down or drained node alone.
    "slurm_state": text,
    "slurm_cpus": whole(0),
    "slurm_reason": text,
}

HINTS: dict[str, str] = {
    "ansible_host": "write the node's host name or IP address, e.g. ansible_host: 10.0.0.2",
    "ansible_host_key_checking": "write ansible_host_key_checking: true (or false, to "
    "accept any host key: unsafe)",
}
HINTS["ansible_ssh_host"] = HINTS["ansible_host"]
HINTS["ansible_become_method"] = (
    "cpuaccel becomes another user with sudo only: ansible_become_method: sudo, or leave it out"
)
HINTS["ansible_become_password"] = (
    "write the sudo password as one plain string (better: "
    "in a file of its own given as -e @secrets.yaml, or ask for it with -K)"
)
HINTS["ansible_become_pass"] = HINTS["ansible_become_password"]
HINTS["ansible_sudo_pass"] = HINTS["ansible_become_password"]
HINTS["ansible_become_flags"] = "remove it (cpuaccel chooses sudo's flags: -H -S or -H -n)"
HINTS["ansible_sudo_flags"] = HINTS["ansible_become_flags"]
HINTS["ansible_become_exe"] = "remove it (cpuaccel runs the node's sudo)"
HINTS["ansible_sudo_exe"] = HINTS["ansible_become_exe"]


def hint_for(name: str) -> str:
    return HINTS.get(name, f"fix the value of {name}")


__all__ = [
    "VARIABLES",
    "BadValue",
    "env_name_problem",
    "host_name_problem",
    "parse_bool",
    "scope_id_problem",
    "secret_value_hint",
    "secret_value_problem",
]
