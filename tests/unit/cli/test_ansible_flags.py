"""The flags an Ansible user types, read as Ansible reads them or refused in one clear
error: -u and --private-key, --list-hosts, -v/-vv/-vvv, sync's -C and -D, and provision's
--list-tasks, --list-tags and --syntax-check without an inventory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpuaccel import ui
from cpuaccel.connectors.connect_options import ConnectOptions
from cpuaccel.connectors.local import LocalConnector
from cpuaccel.connectors.openssh import ssh_argv, ssh_config_stanza
from cpuaccel.errors import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE
from cpuaccel.inventory.host import Host
from tests.unit.ansible_cli import ANSIBLE, ANSIBLE_PLAYBOOK, ansible_env
from testsupport.command import cpuaccel

# Addresses of TEST-NET-1 (RFC 5737): nothing answers there, so a command that tried to
# connect would take its connect timeout and fail; --list-hosts must do neither.
INVENTORY = """\
all:
  children:
    workers:
      hosts:
        node1: {ansible_host: 192.0.2.1}
        node2: {ansible_host: 192.0.2.2, ansible_user: alice}
        node3: {ansible_host: 192.0.2.3}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def _key(tmp_path: Path) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not really a key\n")
    key.chmod(0o600)
    return key


# ---------------------------------------------------------------- -u and --private-key


def test_user_and_key_fill_in_where_the_inventory_sets_none() -> None:
    options = ConnectOptions(user="bob", private_key="/keys/id_bob")
    plain = ssh_argv(Host("n1", {"ansible_host": "10.0.0.1"}), options)
    assert plain[plain.index("-l") + 1] == "bob"
    assert plain[plain.index("-i") + 1] == "/keys/id_bob"
    stanza = ssh_config_stanza(Host("n1", {"ansible_host": "10.0.0.1"}), options, "/kh")
    assert '    User "bob"\n' in stanza and '    IdentityFile "/keys/id_bob"\n' in stanza


def test_a_relative_key_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cpuaccel.api.target import HostFlags, resolve_target

    _key(tmp_path)
    monkeypatch.chdir(tmp_path)  # rsync and MPI's ssh run elsewhere: they need it absolute
    target = resolve_target(HostFlags(forks=1, timeout=1.0, user="bob", private_key="id_test"))
    assert target.connect.private_key == str(tmp_path / "id_test")
    assert target.connect.user == "bob"


def test_the_inventorys_user_and_key_win_over_the_flags_as_in_ansible() -> None:
    # Ansible's precedence: command-line values (-u) are below every variable.
    options = ConnectOptions(user="bob", private_key="/keys/id_bob")
    host = Host("n1", {"ansible_user": "alice", "ansible_ssh_private_key_file": "/k/alice"})
    argv = ssh_argv(host, options)
    assert argv[argv.index("-l") + 1] == "alice" and argv[argv.index("-i") + 1] == "/k/alice"
    stanza = ssh_config_stanza(host, options, "/kh")
    assert 'User "alice"' in stanza and 'IdentityFile "/k/alice"' in stanza and "bob" not in stanza


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("-u", "bad user"), "-u/--user 'bad user'"),
        (("-u", "-rf"), "-u/--user '-rf'"),
        (("--private-key", "/nonexistent/id"), "--private-key /nonexistent/id: the file does"),
        (("--key-file", "/tmp"), "--private-key /tmp: the file is not a regular file"),
    ],
)
def test_a_bad_user_or_key_is_one_error_naming_the_flag(
    project: Path, args: tuple[str, ...], words: str
) -> None:
    proc = cpuaccel("check", "-i", "inventory.yaml", *args, cwd=project)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert words in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_run_dry_run_accepts_the_ansible_login_flags(project: Path, tmp_path: Path) -> None:
    key = _key(tmp_path)
    args = ("-u", "bob", "--private-key", str(key), "--dry-run", "--ppn", "1", "train.py")
    proc = cpuaccel("run", "-i", "inventory.yaml", *args, cwd=project)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "mpirun" in proc.stdout or "mpiexec" in proc.stdout


# ---------------------------------------------------------------- --list-hosts


@pytest.mark.parametrize(
    "verb",
    [
        ("check",),
        ("sync",),
        ("provision", "--playbook", "{book}"),
        ("config", "show"),
        ("run", "train.py"),
    ],
)
def test_list_hosts_prints_the_selection_and_contacts_none(
    project: Path, verb: tuple[str, ...]
) -> None:
    book = project / "site.yaml"
    book.write_text("- hosts: all\n  tasks:\n    - debug: {msg: hi}\n")
    argv = [word.replace("{book}", str(book)) for word in verb]
    *command, last = argv
    # run's SCRIPT comes last, after the options.
    args = [*argv, "-i", "inventory.yaml", "-l", "workers:!node2", "--list-hosts"]
    if verb[0] == "run":
        args = [*command, "-i", "inventory.yaml", "-l", "workers:!node2", "--list-hosts", last]
    proc = cpuaccel(*args, "-T", "30", cwd=project, timeout=20)
    assert proc.returncode == EXIT_OK, proc.stderr
    # provision lists each play's hosts (its pattern within --limit), as ansible-playbook.
    play = "play #1 (all): play 1\n" if verb[0] == "provision" else ""
    assert proc.stdout == play + "  hosts (2):\n    node1\n    node3\n"


def test_provision_lists_each_plays_hosts(project: Path) -> None:
    (project / "site.yaml").write_text(
        "- hosts: all\n  tasks: []\n- name: second\n  hosts: 'node2:node3'\n  tasks: []\n"
    )
    args = ("--playbook", "site.yaml", "--list-hosts", "-l", "!node3")
    proc = cpuaccel("provision", "inventory.yaml", *args, cwd=project)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout == (
        "play #1 (all): play 1\n  hosts (2):\n    node1\n    node2\n"
        "play #2 (node2:node3): second\n  hosts (1):\n    node2\n"
    )


def test_a_plays_hosts_come_in_its_patterns_order_as_ansible_runs_them(project: Path) -> None:
    """A play's ``hosts:`` is a pattern, not a --limit: its terms' hosts in turn (not the
    inventory's order), and no ``@file``. Ansible runs a play's hosts in the order
    ``ansible PATTERN`` lists (ansible-playbook's own --list-hosts prints a set)."""
    (project / "site.yaml").write_text("- hosts: 'node3:node1'\n  tasks: []\n")
    proc = cpuaccel("provision", "-i", "inventory.yaml", "site.yaml", "--list-hosts", cwd=project)
    assert proc.returncode == EXIT_OK, proc.stderr
    ours = [line.strip() for line in proc.stdout.splitlines()[2:]]
    home = project / "ansible-home"
    home.mkdir()
    theirs = {}
    for program, args in ((ANSIBLE, ["node3:node1"]), (ANSIBLE_PLAYBOOK, ["site.yaml"])):
        done = subprocess.run(
            [str(program), "-i", "inventory.yaml", *args, "--list-hosts"],
            capture_output=True, text=True, cwd=project, timeout=120, check=True,
            env=ansible_env(home),
        )  # fmt: skip
        theirs[program.name] = done.stdout.split("hosts (2):")[1].split()
    assert ours == theirs["ansible"] == ["node3", "node1"], (proc.stdout, theirs)
    assert sorted(theirs["ansible-playbook"]) == sorted(ours)
    (project / "hosts.txt").write_text("node2\n")
    (project / "site.yaml").write_text("- hosts: '@hosts.txt'\n  tasks: []\n")
    proc = cpuaccel("provision", "-i", "inventory.yaml", "site.yaml", "--list-hosts", cwd=project)
    assert proc.returncode == EXIT_USAGE and "@hosts.txt" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_provision_takes_the_playbook_in_ansible_playbooks_order(project: Path) -> None:
    (project / "site.yml").write_text(
        "---\n# a comment first\n- hosts: all\n  tasks: []\n- name: second\n"
        "  hosts: node2\n  tasks: []\n"
    )
    proc = cpuaccel("provision", "-i", "inventory.yaml", "site.yml", "--list-hosts", cwd=project)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout.splitlines()[0] == "play #1 (all): play 1"
    assert "play #2 (node2): second" in proc.stdout


def test_provision_says_why_an_argument_is_not_taken_as_the_playbook(project: Path) -> None:
    (project / "other.yml").write_text("workers:\n  hosts:\n    node9:\n")
    proc = cpuaccel("provision", "-i", "inventory.yaml", "other.yml", cwd=project)
    assert proc.returncode == EXIT_USAGE
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "error: two inventories given: -i inventory.yaml and other.yml"
    assert "top level is a list of plays" in lines[1] and "--playbook FILE" in lines[1]


@pytest.mark.parametrize("connection", ["local", "ssh", "paramiko"])
def test_ansibles_connection_given_as_c_is_named(project: Path, connection: str) -> None:
    proc = cpuaccel("check", "-i", "inventory.yaml", "-c", connection, cwd=project)
    assert proc.returncode == EXIT_USAGE
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"error: {connection}: config file not found"
    assert lines[1] == (
        "  fix: -c is cpuaccel's --config, not Ansible's --connection: write "
        f"-e ansible_connection={connection} (or set it in the inventory) instead"
    )


def test_list_hosts_of_run_follows_nodes_and_the_head(project: Path) -> None:
    (project / "cpuaccel.yaml").write_text("head: node3\n")
    args = ("--nodes", "2", "--list-hosts", "train.py")
    proc = cpuaccel("run", "-i", "inventory.yaml", *args, cwd=project)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout == "  hosts (2):\n    node3\n    node1\n"


# ---------------------------------------------------------------- -v, -vv, -vvv


def test_verbosity_levels_on_check(tmp_path: Path) -> None:
    quiet = cpuaccel("check", cwd=tmp_path)
    one = cpuaccel("check", "-v", cwd=tmp_path)
    two = cpuaccel("check", "-vv", cwd=tmp_path)
    assert quiet.returncode == one.returncode == two.returncode == EXIT_OK
    assert "localhost: ok in" not in quiet.stderr
    assert "localhost: ok in" in one.stderr and "localhost: $ " not in one.stderr
    # -vv: the command sent, as commandline.shell_line renders it, and its exit code.
    assert "localhost: $ " in two.stderr and " -c 'import sys;exec(" in two.stderr
    assert "localhost: exit 0 in" in two.stderr
    assert "--verbose" in cpuaccel("help", "hosts").stdout


def test_vvv_turns_on_the_ssh_librarys_debug_log() -> None:
    import logging

    try:
        ui.set_verbosity(3)
        assert logging.getLogger("paramiko").getEffectiveLevel() == logging.DEBUG
    finally:
        ui.set_verbosity(0)
        logging.getLogger("paramiko").setLevel(logging.WARNING)


def test_vv_never_shows_environment_values(capsys: pytest.CaptureFixture[str]) -> None:
    conn = LocalConnector(Host("box", {"ansible_connection": "local"}), ConnectOptions())
    try:
        ui.set_verbosity(2)
        check = 'test "$HF_TOKEN" = "$(printf s3)cret"'  # the value itself is not in argv
        result = conn.run(["sh", "-c", check], env={"HF_TOKEN": "s3cret"})
    finally:
        ui.set_verbosity(0)
    assert result.ok  # the value did reach the command
    err = capsys.readouterr().err
    assert "box: $ env 'HF_TOKEN=***' sh -c" in err and "s3cret" not in err


def test_provision_verbosity_levels(tmp_path: Path) -> None:
    (tmp_path / "inventory.yaml").write_text(
        "all:\n  hosts:\n    local0:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    (tmp_path / "site.yaml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: say\n      command: echo '[b]hi[/]'\n      changed_when: false\n"
    )
    base = ("provision", "inventory.yaml", "--playbook", "site.yaml")
    quiet, one, two = (cpuaccel(*base, *v, cwd=tmp_path) for v in ((), ("-v",), ("-vv",)))
    assert quiet.returncode == one.returncode == two.returncode == EXIT_OK, two.stderr
    assert "ok: local0" not in quiet.stdout  # a line a task, hosts only when they changed
    assert "      ok: local0: [b]hi[/]" in one.stdout and "$ echo" not in one.stdout
    # -vv: the command the task ran on the node (its argv, shell-quoted) and exit code.
    assert "        $ echo '[b]hi[/]'  (exit 0)" in two.stdout
    assert "local0: $ " in two.stderr  # and the agent's own start, from the connector


# ---------------------------------------------------------------- sync -C and -D


def test_sync_check_and_diff_with_ansibles_short_flags(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "kept.py").write_text("same\n")
    (src / "edited.py").write_text("old\n")
    assert cpuaccel("sync", "--dest", str(dest), "src", cwd=tmp_path).returncode == EXIT_OK
    (src / "edited.py").write_text("new\n")
    (src / "added.py").write_text("x\n")
    (dest / "extra.py").write_text("x\n")
    proc = cpuaccel("sync", "-C", "-D", "--delete", "--dest", str(dest), "src", cwd=tmp_path)
    assert proc.returncode == EXIT_PROBLEMS, proc.stdout + proc.stderr
    assert "    + added.py\n    ~ edited.py\n    - extra.py\n" in proc.stdout
    assert "kept.py" not in proc.stdout
    assert not (dest / "added.py").exists() and (dest / "edited.py").read_text() == "old\n"
    done = cpuaccel("sync", "-D", "--delete", "--dest", str(dest), "src", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "    + added.py\n    ~ edited.py\n    - extra.py\n" in done.stdout
    assert (dest / "edited.py").read_text() == "new\n" and not (dest / "extra.py").exists()


# ---------------------------------------------------------------- provision without hosts

MARKUP_BOOK = """\
- name: "[red]play[/]"
  hosts: all
  tasks:
    - name: "[bold]x[/]"
      assert: {that: ["1 == 1"]}
      tags: [setup]
    - debug: {msg: hi}
      tags: ["[dim]t[/]"]
"""


def test_list_tasks_needs_no_inventory_and_keeps_the_module_column(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(MARKUP_BOOK)
    proc = cpuaccel("provision", "--playbook", "site.yaml", "--list-tasks", cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "play: [red]play[/] (hosts: all)"
    assert lines[1] == "  [bold]x[/]  [assert] site.yaml:4  tags: setup"
    assert lines[2] == "  debug  [debug] site.yaml:7  tags: [dim]t[/]"


def test_list_tags_and_syntax_check_need_no_inventory(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(MARKUP_BOOK)
    tags = cpuaccel("provision", "--playbook", "site.yaml", "--list-tags", cwd=tmp_path)
    assert tags.returncode == EXIT_OK, tags.stderr
    assert tags.stdout == "play: [red]play[/] (hosts: all)  TASK TAGS: [[dim]t[/], setup]\n"
    ok = cpuaccel("provision", "--playbook", "site.yaml", "--syntax-check", cwd=tmp_path)
    assert ok.returncode == EXIT_OK and "syntax OK, 2 task(s)" in ok.stdout, ok.stderr
    (tmp_path / "bad.yaml").write_text("- hosts: all\n  tasks:\n    - delegate_to: x\n")
    bad = cpuaccel("provision", "--playbook", "bad.yaml", "--syntax-check", cwd=tmp_path)
    assert bad.returncode == EXIT_USAGE and "bad.yaml:3: delegate_to: not supported" in bad.stderr
