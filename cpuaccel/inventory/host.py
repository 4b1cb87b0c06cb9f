"""Host: one machine of the inventory, with its merged variables.

Connection settings are read from Ansible's variable names so that an existing Ansible
inventory works unchanged; cpuaccel's own settings are prefixed ``cpuaccel_``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PYTHON = "python3"
DEFAULT_WORKDIR = "~/cpuaccel"

# Ansible's legacy aliases, still common in older inventories.
_ALIASES = {
    "ansible_host": ("ansible_host", "ansible_ssh_host"),
    "ansible_port": ("ansible_port", "ansible_ssh_port"),
    "ansible_user": ("ansible_user", "ansible_ssh_user"),
}


def ssh_options(vars: Mapping[str, Any]) -> dict[str, str]:
    """The ``-o Key=Value`` options found in Ansible's ssh argument variables.

    Ansible users pin known_hosts files and key checking this way
    (``ansible_ssh_common_args: -o UserKnownHostsFile=...``); reading the same options
    lets one inventory drive both tools. Keys are lower-cased, as ssh treats them.
    """
    options: dict[str, str] = {}
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        raw = vars.get(name)
        if not raw:
            continue
        words = shlex.split(str(raw))
        for i, word in enumerate(words):
            if word == "-o" and i + 1 < len(words):
                opt = words[i + 1]
            elif word.startswith("-o") and len(word) > 2:
                opt = word[2:]
            else:
                continue
            key, sep, value = opt.partition("=")
            if not sep:
                key, _, value = opt.partition(" ")
            options[key.strip().lower()] = value.strip()
    return options


@dataclass(frozen=True)
class Host:
    """A host and its variables, merged with Ansible's precedence by the Inventory."""

    name: str
    vars: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    def _first(self, key: str) -> Any:
        for alias in _ALIASES.get(key, (key,)):
            if self.vars.get(alias) is not None:
                return self.vars[alias]
        return None

    @property
    def is_local(self) -> bool:
        return str(self.vars.get("ansible_connection", "ssh")) == "local"

    @property
    def slurm_job(self) -> str | None:
        """The Slurm job this node is allocated to (slurm/allocation.py), if any."""
        value = self.vars.get("cpuaccel_slurm_job")
        return None if value is None else str(value)

    @property
    def address(self) -> str:
        """What to connect to: ``ansible_host``, else the inventory name."""
        value = self._first("ansible_host")
        return str(value) if value is not None else self.name

    @property
    def port(self) -> int | None:
        """The port the inventory sets (``ansible_port``, or ``-o Port=`` in the ssh
        arguments); None when it sets none, so that ssh_config decides, as for ``ssh``
        itself (see connectors/openssh.port_of)."""
        value = self._first("ansible_port")
        if value is None:
            value = ssh_options(self.vars).get("port")
        return int(value) if value is not None else None  # validated by the Inventory

    @property
    def user(self) -> str | None:
        value = self._first("ansible_user")
        if value is None:
            value = ssh_options(self.vars).get("user")
        return str(value) if value is not None else None

    @property
    def key_file(self) -> str | None:
        value = self.vars.get("ansible_ssh_private_key_file") or self.vars.get(
            "ansible_private_key_file"
        )
        if value is None:
            value = ssh_options(self.vars).get("identityfile")
        return str(value) if value else None

    @property
    def known_hosts_file(self) -> str | None:
        """Extra known_hosts file (``cpuaccel_known_hosts``, or ssh's UserKnownHostsFile).

        Whether keys are checked at all is decided in connectors/hostkeys.py."""
        value = self.vars.get("cpuaccel_known_hosts") or ssh_options(self.vars).get(
            "userknownhostsfile"
        )
        return str(value) if value else None

    @property
    def python(self) -> str:
        """``cpuaccel_python``, else the python of ``cpuaccel_venv`` (what provision
        creates), else the node's ``python3``."""
        if self.vars.get("cpuaccel_python"):
            return str(self.vars["cpuaccel_python"])
        if self.vars.get("cpuaccel_venv"):
            return str(self.vars["cpuaccel_venv"]).rstrip("/") + "/bin/python"
        return DEFAULT_PYTHON

    @property
    def workdir(self) -> str:
        return str(self.vars.get("cpuaccel_workdir") or DEFAULT_WORKDIR)

    @property
    def setvars(self) -> str | None:
        value = self.vars.get("cpuaccel_setvars")
        return str(value) if value else None

    def __str__(self) -> str:
        return self.name
