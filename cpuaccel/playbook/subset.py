"""The subset of Ansible's playbook language cpuaccel runs, and what it refuses.

Every keyword a play or task may hold is here: supported (PLAY_KEYS, TASK_KEYS) or
refused with the reason and what to write instead (REFUSED, TASK_ONLY). The loader
checks every key against these tables, so that nothing in a playbook is silently
ignored; docs/provision.md's "Playbook subset" table is this module in prose.
"""

from __future__ import annotations

PLAY_KEYS = frozenset({"name", "hosts", "vars", "tasks", "gather_facts", "tags"})
TASK_KEYS = frozenset(
    {
        "name",
        "when",
        "register",
        "changed_when",
        "failed_when",
        "loop",
        "with_items",
        "loop_control",
        "tags",
        "ignore_errors",
        "run_once",
        "vars",
        "args",
        "environment",
        "timeout",
        "check_mode",
    }
)
LOOP_CONTROL_KEYS = frozenset({"loop_var"})

_ONE_FILE = "cpuaccel runs one playbook file: put the tasks in it"
_LINEAR = "cpuaccel runs every task on all hosts at once (Ansible's linear strategy, --forks)"
_HANDLERS = "no handlers: register the result and add a later task with 'when: result is changed'"

# Ansible's play and task keywords outside the subset: (why, what to write instead).
# become, become_user and become_method are not listed: they are provision's (sudo).
REFUSED: dict[str, tuple[str, str]] = {
    "delegate_to": (
        "a task runs on its own host",
        "write a play with 'hosts: NAME' for the tasks of that host",
    ),
    "delegate_facts": ("no delegation", "write a play for that host"),
    "local_action": (
        "a task runs on its own host",
        "assert, fail, debug, set_fact and wheelhouse run on the controller already",
    ),
    "action": ("the module is the task's key", "write e.g. 'command: ...' instead of 'action:'"),
    "connection": (
        "how to reach a host is the inventory's",
        "set ansible_connection in the inventory",
    ),
    "remote_user": ("the login user is the inventory's", "set ansible_user, or pass -u USER"),
    "port": ("the SSH port is the inventory's", "set ansible_port in the inventory"),
    "async": ("tasks run to completion", "use 'timeout:' on command and shell tasks"),
    "poll": ("tasks run to completion", "use 'timeout:' on command and shell tasks"),
    "until": ("no retry loop", "make the command retry itself, or run provision again"),
    "retries": ("no retry loop", "make the command retry itself, or run provision again"),
    "delay": ("no retry loop", "make the command retry itself, or run provision again"),
    "notify": ("no handlers", _HANDLERS),
    "listen": ("no handlers", _HANDLERS),
    "handlers": ("no handlers", _HANDLERS),
    "force_handlers": ("no handlers", _HANDLERS),
    "block": ("no blocks", "write the tasks one by one, each with its when: and tags:"),
    "rescue": ("no blocks", "use ignore_errors: and register: with a later 'when:'"),
    "always": ("no blocks", "write the tasks one by one after the others"),
    "roles": ("no roles", _ONE_FILE),
    "include_role": ("no roles", _ONE_FILE),
    "import_role": ("no roles", _ONE_FILE),
    "include_tasks": ("no includes", _ONE_FILE),
    "import_tasks": ("no includes", _ONE_FILE),
    "include": ("no includes", _ONE_FILE),
    "import_playbook": ("no includes", "run each playbook with its own cpuaccel provision"),
    "include_vars": ("no includes", "use vars:, or -e @file.yaml"),
    "vars_files": ("no variable files", "use vars:, group_vars/, or -e @file.yaml"),
    "vars_prompt": ("provision asks nothing", "pass the value with -e NAME=VALUE"),
    "pre_tasks": ("one list of tasks a play", "put them at the start of tasks:"),
    "post_tasks": ("one list of tasks a play", "put them at the end of tasks:"),
    "serial": ("no batches", _LINEAR),
    "strategy": ("one strategy", _LINEAR),
    "throttle": ("one limit for all", "use --forks"),
    "order": ("hosts run in inventory order", "reorder the inventory, or use --limit"),
    "max_fail_percentage": ("a failed host stops alone", "check the recap and exit code"),
    "any_errors_fatal": ("a failed host stops alone", "check the recap and exit code"),
    "ignore_unreachable": (
        "an unreachable host stops alone",
        "use --limit to leave it out",
    ),
    "no_log": (
        "cpuaccel cannot promise to hide a task's output",
        "keep secrets in cpuaccel_secret_env, which run passes only to the nodes",
    ),
    "diff": ("diffs are the command line's", "pass --diff"),
    "debugger": ("no task debugger", "run with -v, -vv or -vvv"),
    "collections": ("no collections", "write modules by their short name (copy, not x.y.copy)"),
    "module_defaults": ("no module defaults", "give each task its arguments"),
    "gather_subset": ("facts are gathered whole", "use gather_facts: false to skip them"),
    "gather_timeout": ("facts use the connection's timeout", "pass -T/--connect-timeout"),
    "fact_path": ("no local facts", "register a command's output instead"),
}

# Supported on tasks, refused on plays (Ansible takes them on both).
TASK_ONLY = frozenset(
    {"environment", "check_mode", "ignore_errors", "run_once", "timeout", "when", "register"}
)


def refusal(key: str, *, on_play: bool) -> tuple[str, str] | None:
    """(message, hint) when ``key`` is an Ansible keyword outside the subset."""
    if key in REFUSED:
        why, instead = REFUSED[key]
        return f"{key}: not supported by cpuaccel ({why})", instead
    if key.startswith("with_") and key != "with_items":
        return f"{key}: not supported by cpuaccel (only with_items)", "use 'loop:' with a list"
    if key.startswith(("ansible.builtin.", "ansible.legacy.")):
        short = key.rsplit(".", 1)[1]
        return (
            f"{key}: cpuaccel's modules have no collection prefix",
            f"write '{short}:'",
        )
    if on_play and key in TASK_ONLY:
        return f"{key}: cpuaccel takes it on tasks, not on plays", f"set '{key}:' on each task"
    return None
