"""The files through which a client finds the test nodes: the nodes' shared /etc/hosts,
known_hosts, and an Ansible YAML inventory as a user would write it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpuaccel.testbed.netns import CONTROLLER_NAME, WORKDIR, Node


class _FlowDict(dict[str, Any]):
    """A mapping written in YAML flow style (``{ansible_host: 10.77.0.1}``)."""


class _InventoryDumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: yaml.SafeDumper, data: _FlowDict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)


_InventoryDumper.add_representer(_FlowDict, _represent_flow)


def hosts_text(controller_address: str, nodes: Sequence[Node]) -> str:
    """The /etc/hosts every node sees: localhost, the controller and each node by name."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines.append(f"{controller_address} {CONTROLLER_NAME}")
    lines += [f"{node.address} {node.name}" for node in nodes]
    return "\n".join(lines) + "\n"


def known_hosts_text(host_keys: Sequence[tuple[Node, Path]]) -> str:
    """known_hosts lines for (node, private host key path): by name and by address."""
    known = []
    for node, key_path in host_keys:
        key_type, key = key_path.with_suffix(".pub").read_text().split()[:2]
        known.append(f"{node.name},{node.address} {key_type} {key}")
    return "\n".join(known) + "\n"


@dataclass(frozen=True)
class Access:
    """How a client reaches the test nodes: root's private key, the known_hosts file
    that holds the nodes' keys, and the Python every node runs (a shared filesystem)."""

    key_path: Path
    known_hosts_path: Path
    python: str


def inventory_text(
    nodes: Sequence[Node],
    access: Access,
    *,
    host_overrides: Mapping[str, Mapping[str, Any]],
    only: Sequence[str] | None,
    extra_vars: Mapping[str, Any],
    owner: str,
    aliases: Mapping[str, str] | None = None,
) -> str:
    """The inventory YAML of `nodes` (see :meth:`Cluster.write_inventory` for the options).

    KeyError names `owner` (the cluster) if `host_overrides`, `only` or `aliases` name
    other nodes.
    """
    aliases = aliases or {}
    names = {node.name for node in nodes}
    unknown = (set(host_overrides) | set(aliases)) - names
    if only is not None:
        unknown |= set(only) - names
    if unknown:
        raise KeyError(f"no such nodes in {owner}: {sorted(unknown)}")
    group_vars: dict[str, Any] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(access.key_path),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={access.known_hosts_path} -o StrictHostKeyChecking=yes"
        ),
        # Without it ansible-core probes for an interpreter over ssh, and on a machine
        # with pyenv in root's login PATH it picks a shim that fails on the nodes. The
        # caller's venv python is on every node (shared filesystem).
        "ansible_python_interpreter": access.python,
        "cpuaccel_python": access.python,
        "cpuaccel_workdir": str(WORKDIR),
    }
    group_vars.update(extra_vars)
    # None removes a default (e.g. cpuaccel_python=None: nodes use cpuaccel_venv).
    group_vars = {k: v for k, v in group_vars.items() if v is not None}
    hosts: dict[str, Any] = {}
    for node in nodes:
        if only is not None and node.name not in only:
            continue
        host = _FlowDict(ansible_host=node.address)
        host.update(host_overrides.get(node.name, {}))
        hosts[aliases.get(node.name, node.name)] = host
    document = {"all": {"vars": group_vars, "hosts": hosts}}
    return yaml.dump(
        document, Dumper=_InventoryDumper, sort_keys=False, default_flow_style=False, width=200
    )
