"""Which project file a verb reads: ``discover_config``.

``--config FILE``, else ``./cpuaccel.yaml``, else Accelerate's default config where
``accelerate launch`` would find it; a file is read as Accelerate's when its fields say
so (config/accelerate.py), else as cpuaccel's own (config/project.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from cpuaccel.config.project import (
    PROJECT_FILE,
    ProjectConfig,
    is_accelerate,
    parse_mapping,
    parse_project,
)
from cpuaccel.errors import ProjectFileError
from cpuaccel.inventory.inventory import DEFAULT_FILE as INVENTORY_FILE
from cpuaccel.inventory.inventory import ENV_VAR as INVENTORY_ENV
from cpuaccel.sourcefile import read_source

# Values of Ansible's -c/--connection, which cpuaccel's -c (--config) is not.
ANSIBLE_CONNECTIONS = ("local", "ssh", "paramiko", "smart")


def load_config(path: str | Path) -> ProjectConfig:
    """A cpuaccel.yaml, or Accelerate's default_config.yaml (recognised by its fields)."""
    source = str(path)
    hint = "pass an existing file with --config FILE"
    if source in ANSIBLE_CONNECTIONS and not os.path.lexists(source):
        # `-c local` is Ansible's --connection; cpuaccel's -c is --config.
        hint = (
            f"-c is cpuaccel's --config, not Ansible's --connection: write "
            f"-e ansible_connection={source} (or set it in the inventory) instead"
        )
    text = read_source(path, ProjectFileError, "config file", hint)
    fields = parse_mapping(text, source, "config file")
    if is_accelerate(fields):
        # Loaded only for such a file: it reads hostfiles, which a .yaml inventory never needs.
        from cpuaccel.config.accelerate import from_accelerate

        return from_accelerate(fields, source)
    return parse_project(text, source)


def accelerate_default() -> str:
    """Where `accelerate launch` finds its config when given none: $HF_HOME/accelerate/
    default_config.yaml, $HF_HOME being $XDG_CACHE_HOME/huggingface (~/.cache/...)."""
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    return os.path.join(os.path.expanduser(home), "accelerate", "default_config.yaml")


def discover_config(path: str | None, inventory_flag: str | None = None) -> ProjectConfig | None:
    """--config FILE, else ./cpuaccel.yaml when there is one, else Accelerate's default
    config when there is one (as `accelerate launch` reads it), else none.
    ``inventory_flag``: the -i given, if any (a single-machine default config then
    gives way to it)."""
    if path:
        return load_config(path)
    if os.path.lexists(PROJECT_FILE):
        # Present but not a file (a FIFO, a dangling link) is an error, not "no project
        # file": silently running on this machine alone would surprise more.
        return load_config(PROJECT_FILE)
    default = accelerate_default()
    if not os.path.lexists(default):
        return None
    why = "read as Accelerate's default config, there being no ./cpuaccel.yaml nor --config"
    try:
        config = load_config(default)
    except ProjectFileError as exc:  # file:line, as with --config; and why it was read
        exc.hint = f"{exc.hint} ({why})" if exc.hint else why
        raise
    named = inventory_flag or os.environ.get(INVENTORY_ENV) or os.path.lexists(INVENTORY_FILE)
    if config.local_only and named:
        # A single-machine config (what `accelerate config` writes on a laptop) must not
        # turn a run on the inventory's hosts into one on this machine: not used.
        return None
    config.warnings.insert(0, f"using {default}: {why}; pass --config FILE for another")
    return config
