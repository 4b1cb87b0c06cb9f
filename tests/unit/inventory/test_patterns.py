"""Host patterns (--limit, a play's hosts:) against Ansible itself.

Every form of Ansible's page "Patterns: targeting hosts and groups", in the page's
order, then the edge cases of its InventoryManager, is given to Ansible and to cpuaccel
on one INI and one YAML inventory (nested groups, a host in several groups, ranges,
IPv4 and IPv6 addresses, hosts listed in other orders in other groups).

Ansible answers through its own command, ``ansible -i INV PATTERN --list-hosts`` (a
pattern's order) and ``ansible -i INV all --limit PATTERN --list-hosts`` (a --limit's:
the order of ``all``). To keep hundreds of them quick, one process imports the
``ansible`` command's code once and forks a child a command, each child running it as
the ``ansible`` script would with its own argv and output; a few answers are checked
against the ``ansible`` program itself.

A pattern Ansible answers with hosts and no warning must select the same hosts in the
same order here; one that Ansible warns about (a term that matches nothing), or answers
with no host, must be refused (InventoryError, exit 64 at the CLI).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from cpuaccel import userregex
from cpuaccel.errors import EXIT_USAGE, InventoryError
from cpuaccel.inventory.host import Host
from cpuaccel.inventory.inventory import Inventory
from tests.unit.ansible_cli import ANSIBLE, ansible_env
from testsupport.command import cpuaccel

# Hosts before any section are "ungrouped"; bastion is an alias whose ansible_host is an
# address. dc names its children before their sections: Ansible adds each child when
# its section comes, so dc's children are east, then west. gpu lists its hosts in
# another order than compute.
INI_INVENTORY = """\
jump.example.com
bastion ansible_host=192.0.2.99

[dc:children]
west
east

[east:children]
web
atlanta

[web]
web3.example.com
web1.example.com
web2.example.com
192.0.2.10

[west]
db2.example.com
db1.example.com
web1.example.com

[atlanta]
web1.example.com
192.0.2.10
node02

[staging]
web2.example.com
db1.example.com
node[03:04]

[compute:children]
gpu

[compute]
node[01:06]

[gpu]
node05
node02

[v6]
2001:db8::1
fe80::10

[empty]
"""

# The same hosts and groups, written in YAML's other orders: hosts in "all" itself,
# compute's children before its hosts (so node05 is listed before node01).
YAML_INVENTORY = """\
all:
  hosts:
    jump.example.com:
    bastion:
      ansible_host: 192.0.2.99
  children:
    dc:
      children:
        east:
          children:
            web:
              hosts:
                web3.example.com:
                web1.example.com:
                web2.example.com:
                192.0.2.10:
            atlanta:
              hosts:
                web1.example.com:
                192.0.2.10:
                node02:
        west:
          hosts:
            db2.example.com:
            db1.example.com:
            web1.example.com:
    staging:
      hosts:
        web2.example.com:
        db1.example.com:
        node[03:04]:
    compute:
      children:
        gpu:
          hosts:
            node05:
            node02:
      hosts:
        node[01:06]:
    v6:
      hosts:
        "2001:db8::1":
        fe80::10:
    empty:
"""

KINDS = {"ini": ("site.ini", INI_INVENTORY), "yaml": ("site.yaml", YAML_INVENTORY)}

SAME = "same"  # Ansible selects hosts without a warning: cpuaccel selects the same
REFUSED = "refused"  # Ansible warns, fails or selects nothing: cpuaccel refuses
STRICTER = "stricter"  # Ansible drops a term that selects no host: cpuaccel refuses


class Case(NamedTuple):
    form: str
    pattern: str
    expect: str
    says: str = ""  # a fragment of cpuaccel's refusal


# The page's forms in its order, then the edge cases.
CASES = [
    Case("all hosts", "all", SAME),
    Case("all hosts", "*", SAME),
    Case("one host", "web1.example.com", SAME),
    Case("multiple hosts", "web1.example.com:db1.example.com", SAME),
    Case("multiple hosts", "db1.example.com,web1.example.com", SAME),
    Case("one group", "web", SAME),
    Case("multiple groups", "web:west", SAME),
    Case("excluding groups", "web:!atlanta", SAME),
    Case("intersection of groups", "web:&staging", SAME),
    Case("combination", "web:west:&staging:!atlanta", SAME),
    Case("wildcard address", "192.0.*", SAME),
    Case("wildcard name", "*.example.com", SAME),
    Case("wildcard name", "*.com", SAME),
    Case("wildcards and groups", "web*.com:west", SAME),
    Case("a name not in the inventory", "*.not_in_inventory.com", REFUSED, "matches no host"),
    Case("an alias's address", "192.0.2.99", REFUSED, "matches no host"),
    Case("an alias", "bastion", SAME),
    Case("processing order", "web:west:&staging:!atlanta:!gpu", SAME),
    Case("processing order", "&staging:web:!atlanta:west:!gpu", SAME),
    Case("processing order", "!atlanta:web:!gpu:&staging:west", SAME),
    Case("processing order", "web:west:!gpu:!atlanta:&staging", SAME),
    Case("variables in patterns", "web:!{{ excluded }}", REFUSED, "not templated"),
    Case("subscript", "web[0]", SAME),
    Case("subscript", "web[-1]", SAME),
    Case("subscript", "web[0:2]", SAME),
    Case("subscript", "web[1:2]", SAME),
    Case("subscript", "web[1:]", SAME),
    # The page's [:3] is no subscript for Ansible: a glob matching "web:" or "web3".
    Case("subscript", "web[:3]", REFUSED, "matches no host"),
    Case("regular expression", r"~(web|db).*\.example\.com", SAME),
    Case("limit to one host", "web1.example.com", SAME),
    Case("limit to hosts", "web1.example.com,db2.example.com", SAME),
    Case("negated limit", "all:!web1.example.com", SAME),
    Case("limit to a group", "west", SAME),
    # Edge cases.
    Case("duplicates", "web,web,web1.example.com,web", SAME),
    Case("trailing colon", "web:", SAME),
    Case("leading colon", ":web", SAME),
    Case("whitespace after commas", "web, west ,  gpu", SAME),
    Case("whitespace without a comma", "web west", SAME),
    Case("exclusion first", "!atlanta:web", SAME),
    Case("exclusion only", "!web", SAME),
    Case("intersection only", "&staging", SAME),
    Case("intersection and exclusion only", "&staging:!node03", SAME),
    Case("nested children", "dc", SAME),
    Case("nested children", "east", SAME),
    Case("children and own hosts", "compute", SAME),
    Case("all but a group", "all:!dc", SAME),
    Case("all groups but one", "*:!compute", SAME),
    Case("regex holding ':'", "~(?:node0[12])", REFUSED, "end a regex holding ':'"),
    Case("regex holding ':', comma-ended", "~(?:node0[12]),", SAME),
    Case("regex anchored at the end", r"~.*\.example\.com$", SAME),
    Case("regex with a class", "~node0[135]", SAME),
    Case("regex anchored at the start", "~eb", REFUSED, "matches no host"),
    Case("regex with brackets", "~web[12]", SAME),
    Case("excluding a regex", "all:!~node", SAME),
    Case("subscript past the end", "web[7]", REFUSED, "so no host [7]"),
    Case("subscript before the start", "web[-9]", REFUSED, "so no host [-9]"),
    Case("slice past the end", "web[2:9]", SAME),
    Case("slice beyond the hosts", "web[9:12]", REFUSED, "selects no host"),
    Case("slice beyond the hosts, with others", "web,web[9:12]", STRICTER, "selects no host"),
    Case("slice ending at 0", "web[2:0]", SAME),
    Case("slice written with '-'", "web[1-2]", SAME),
    Case("subscript of a glob", "web*[0]", SAME),
    Case("subscript of all", "all[0]", SAME),
    Case("subscript of all", "all[-1]", SAME),
    Case("subscript of a group", "staging[1:3]", SAME),
    Case("subscript of a group", "gpu[0]", SAME),
    Case("subscript of every group", "*[1]", SAME),
    Case("unknown group", "nosuch", REFUSED, "'nosuch' matches no host or group"),
    Case("unknown group among others", "web:nosuch", REFUSED, "'nosuch' matches no host"),
    Case("unknown group excluded", "web:!nosuch", REFUSED, "'nosuch' matches no host"),
    Case("unknown group intersected", "web:&nosuch", REFUSED, "'nosuch' matches no host"),
    Case("empty group", "empty", REFUSED, "has none"),
    Case("empty group, with others", "web,empty", STRICTER, "has none"),
    Case("IPv4 address", "192.0.2.10", SAME),
    Case("IPv6 address", "2001:db8::1", SAME),
    Case("IPv6 addresses", "2001:db8::1,fe80::10", SAME),
    Case("IPv6 address among names", "fe80::10:web", REFUSED, "matches no host"),
    Case("name and port", "node01:22", REFUSED, "matches no host"),
    Case("host range", "node[01:03]", REFUSED, "write ~node0[1-3]$"),
    Case("host range", "node0[1:3]", REFUSED, "write ~node0[1-3]$"),
    Case("host range as a regex", "~node0[1-3]$", SAME),
    Case("glob class", "web[12].example.com", SAME),
    Case("glob negated class", "node0[!1-4]", SAME),
    Case("glob one character", "node0?", SAME),
    Case("glob of groups and hosts", "d*", SAME),
    Case("glob of groups and hosts", "we*", SAME),
    Case("glob of groups", "*t*", SAME),
    Case("glob and intersection", "node*:&staging", SAME),
    Case("ungrouped", "ungrouped", SAME),
    Case("ungrouped", "all:&ungrouped", SAME),
    Case("lone '!'", "web:!", REFUSED, "stands alone"),
    Case("lone '&'", "&", REFUSED, "stands alone"),
    Case("comma and colon", "web,west:&staging", REFUSED, "split on its commas alone"),
    Case("unclosed bracket", "web[0", REFUSED, "opens or closes nothing"),
    Case("unclosed bracket in a regex", "~node[(", REFUSED, "opens or closes nothing"),
    Case("unclosed bracket, with a comma", "web,web[0", REFUSED, "opens or closes nothing"),
    Case("invalid regex, kept whole", "~node[(,", REFUSED, "not a valid regular expression"),
]
CASE_IDS = [f"{case.form}: {case.pattern}" for case in CASES]
LIMIT_FILE_LINES = ["node05", "  db2.example.com  ", "", "web1.example.com", "~node0[34]"]
BAD_LIMIT_FILE_LINES = ["web1.example.com", "web:west"]

# A child of the forked `ansible` runs it as the `ansible` script does, its output in a
# file. The plugins it would import are imported once, before the forks; each child
# parses its inventory and sets up its command anew.
DRIVER = r"""
import importlib, json, os, sys
from ansible.cli.adhoc import main
for name in (
    "ansible.plugins.inventory.ini",
    "ansible.plugins.inventory.yaml",
    "ansible.plugins.vars.host_group_vars",
    "ansible.plugins.cache.memory",
    "ansible.plugins.doc_fragments.vars_plugin_staging",
    "ansible.utils.shlex",
    "ansible._internal._json._profiles._inventory_legacy",
):
    try:
        importlib.import_module(name)
    except ImportError:  # another version of Ansible: that child imports what it needs
        pass

def child(argv, path):
    code = 1
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

commands, folder = json.load(sys.stdin), sys.argv[1]
running, codes = {}, {}
for index, argv in enumerate(commands):
    if len(running) == 2:
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    pid = os.fork()
    if pid == 0:
        child(argv, os.path.join(folder, str(index)))
    running[pid] = index
while running:
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
answers = []
for index in range(len(commands)):
    with open(os.path.join(folder, str(index)), encoding="utf-8", errors="replace") as out:
        answers.append([codes[index], out.read()])
json.dump(answers, sys.stdout)
"""


class Answer(NamedTuple):
    """What ``ansible ... --list-hosts`` printed: its hosts, whether it warned that a
    term matched nothing, and whether it failed."""

    hosts: list[str]
    unmatched: bool
    failed: bool
    text: str

    @property
    def selection(self) -> list[str] | None:
        """The hosts, when Ansible selected some without a warning; else None."""
        return self.hosts if self.hosts and not (self.unmatched or self.failed) else None


def answer(code: int, text: str) -> Answer:
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("  hosts (")]
    hosts = [line.strip() for line in lines[heads[0] + 1 :]] if heads else []
    unmatched = "Could not match supplied host pattern" in text
    return Answer(hosts, unmatched, code != 0 or "[ERROR]" in text, text)


def list_hosts_argv(inventory: Path, pattern: str, limit: bool) -> list[str]:
    if limit:
        return ["ansible", "-i", str(inventory), "all", "--limit", pattern, "--list-hosts"]
    return ["ansible", "-i", str(inventory), pattern, "--list-hosts"]


class Ansible:
    """Ansible's answers to every command these tests ask it, worked out at once."""

    def __init__(self, folder: Path) -> None:
        if not ANSIBLE.exists():
            pytest.fail(
                f"Ansible is not installed beside {sys.executable} (these tests compare "
                "with it): pip install -e '.[dev]'"
            )
        self.folder = folder
        self.env = ansible_env(folder)
        self.inventories = {kind: folder / name for kind, (name, _) in KINDS.items()}
        for kind, (_, text) in KINDS.items():
            self.inventories[kind].write_text(text)
        self.limit_file = folder / "retry.txt"
        self.limit_file.write_text("\n".join(LIMIT_FILE_LINES) + "\n")
        self.bad_limit_file = folder / "bad-retry.txt"
        self.bad_limit_file.write_text("\n".join(BAD_LIMIT_FILE_LINES) + "\n")
        self.corpus = sorted((Path(__file__).parent / "data" / "ini").glob("*.[iy]*"))
        commands = [
            list_hosts_argv(self.inventories[kind], case.pattern, limit)
            for kind in KINDS
            for case in CASES
            for limit in (False, True)
        ]
        commands += [list_hosts_argv(path, "all", False) for path in self.corpus]
        commands += [
            list_hosts_argv(self.inventories["ini"], "localhost", x) for x in (False, True)
        ]
        commands += [
            list_hosts_argv(self.inventories[kind], pattern, True)
            for kind in KINDS
            for pattern in self.limit_file_patterns()
        ]
        outputs = folder / "outputs"
        outputs.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, str(outputs)],
            input=json.dumps(commands),
            capture_output=True,
            text=True,
            env=self.env,
            cwd=folder,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        self.answers = {
            tuple(argv): answer(code, text)
            for argv, (code, text) in zip(commands, json.loads(proc.stdout), strict=True)
        }

    def limit_file_patterns(self) -> list[str]:
        return [
            f"@{self.limit_file}",
            f"@{self.limit_file},!db2.example.com",
            f"staging:@{self.limit_file}",
            f"@{self.bad_limit_file}",
            f"@{self.folder / 'missing.txt'}",
        ]

    def pattern(self, kind: str, pattern: str) -> Answer:
        return self.answers[tuple(list_hosts_argv(self.inventories[kind], pattern, False))]

    def limit(self, kind: str, pattern: str) -> Answer:
        return self.answers[tuple(list_hosts_argv(self.inventories[kind], pattern, True))]

    def all_hosts(self, path: Path) -> Answer:
        return self.answers[tuple(list_hosts_argv(path, "all", False))]


@pytest.fixture(scope="module")
def ansible(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ansible]:
    yield Ansible(tmp_path_factory.mktemp("ansible"))


@pytest.fixture(scope="module")
def inventories(ansible: Ansible) -> dict[str, Inventory]:
    return {kind: Inventory.load(path) for kind, path in ansible.inventories.items()}


def names(hosts: Sequence[Host]) -> list[str]:
    return [host.name for host in hosts]


def refusal(select: Callable[[str], object], pattern: str) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        select(pattern)
    return caught.value


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_patterns_select_what_ansible_selects_in_its_order(
    ansible: Ansible, inventories: dict[str, Inventory], kind: str, case: Case
) -> None:
    """As ``ansible -i INV PATTERN`` (and a play's hosts:): each term's hosts in turn."""
    inventory, told = inventories[kind], ansible.pattern(kind, case.pattern)
    if case.expect == SAME:
        assert told.selection, told.text
        assert names(inventory.select_pattern(case.pattern)) == told.selection
    elif case.expect == STRICTER:
        assert told.selection and not told.unmatched, told.text
        assert case.says in str(refusal(inventory.select_pattern, case.pattern))
    else:
        assert told.selection is None, told.text
        assert case.says in str(refusal(inventory.select_pattern, case.pattern))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_limit_selects_what_ansible_limit_selects_in_inventory_order(
    ansible: Ansible, inventories: dict[str, Inventory], kind: str, case: Case
) -> None:
    """As ``ansible -i INV all --limit PATTERN``: the same hosts, in the order of all."""
    inventory, told = inventories[kind], ansible.limit(kind, case.pattern)
    if case.expect == SAME:
        assert told.selection, told.text
        assert names(inventory.select(case.pattern)) == told.selection
        assert set(told.selection) == set(ansible.pattern(kind, case.pattern).hosts)
    else:
        assert case.expect == STRICTER or told.selection is None, told.text
        error = refusal(inventory.select, case.pattern)
        assert case.says in str(error) and f"--limit {case.pattern!r}" in str(error)
        assert error.exit_code == EXIT_USAGE and error.hint


def test_the_inventories_order_hosts_otherwise_than_the_files_and_each_other(
    ansible: Ansible, inventories: dict[str, Inventory]
) -> None:
    """The comparisons above would prove little if every order were the file's."""
    for kind, inventory in inventories.items():
        every = ansible.pattern(kind, "all").selection
        assert every is not None and every != list(inventory.hosts)
        assert names(inventory.select(None)) == every
    # A glob takes hosts in the order they were first listed, which YAML's compute
    # (children before hosts) changes.
    assert ansible.pattern("ini", "node0?").hosts != ansible.pattern("yaml", "node0?").hosts
    web_west = ansible.pattern("ini", "web:west").selection
    assert web_west is not None and web_west != ansible.limit("ini", "web:west").selection


@pytest.mark.parametrize("kind", list(KINDS))
def test_limit_file_lines_are_terms_as_in_ansible(
    ansible: Ansible, inventories: dict[str, Inventory], kind: str
) -> None:
    inventory = inventories[kind]
    good, with_exclusion, with_group, bad, missing = ansible.limit_file_patterns()
    for pattern in (good, with_exclusion, with_group):
        told = ansible.limit(kind, pattern)
        assert told.selection, told.text
        assert names(inventory.select(pattern)) == told.selection
    # A line is one term, not split: "web:west" matches nothing, in Ansible too.
    assert ansible.limit(kind, bad).unmatched
    assert "'web:west' matches no host" in str(refusal(inventory.select, bad))
    assert ansible.limit(kind, missing).failed
    assert "not found" in str(refusal(inventory.select, missing))
    # Outside a --limit "@..." names no file: a name, which matches nothing.
    assert "matches no host" in str(refusal(inventory.select_pattern, good))


CORPUS = sorted((Path(__file__).parent / "data" / "ini").glob("*.[iy]*"))


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_every_corpus_inventory_lists_all_hosts_in_ansibles_order(
    ansible: Ansible, path: Path
) -> None:
    told = ansible.all_hosts(path)
    assert told.selection, told.text
    assert names(Inventory.load(path).select(None)) == told.selection


def test_the_forked_ansible_answers_as_the_ansible_program(
    ansible: Ansible, tmp_path: Path
) -> None:
    """The answers above come from forks of one process that imported the ``ansible``
    command's code: the program itself, run from scratch, prints the same."""
    samples = [
        ("ini", "web:west:&staging:!atlanta", False),
        ("yaml", "web[1:]", False),
        ("yaml", "*:!compute", True),
        ("ini", r"~(web|db).*\.example\.com", True),
        ("ini", "web:nosuch", False),
        ("yaml", f"@{ansible.limit_file}", True),
    ]
    for kind, pattern, limit in samples:
        argv = list_hosts_argv(ansible.inventories[kind], pattern, limit)
        proc = subprocess.run(
            [str(ANSIBLE), *argv[1:]],
            capture_output=True,
            text=True,
            env=ansible.env,
            cwd=ansible.folder,
            timeout=60,
        )
        forked = ansible.answers[tuple(argv)]
        assert (proc.returncode, proc.stderr + proc.stdout) == (0, forked.text), argv


@pytest.mark.parametrize(
    "pattern",
    ["web:!atlanta", "web[1:]", "&staging:!node03", "~(?:node0[12]),", "all:!dc"],
)
def test_cli_list_hosts_prints_what_ansible_prints(
    ansible: Ansible, pattern: str, tmp_path: Path
) -> None:
    told = ansible.limit("yaml", pattern)
    assert told.selection, told.text
    proc = cpuaccel(
        "check",
        "-i",
        str(ansible.inventories["yaml"]),
        "--limit",
        pattern,
        "--list-hosts",
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stdout) == (0, told.text), proc.stderr


@pytest.mark.parametrize(
    ("pattern", "says"),
    [("web:!", "stands alone"), ("web[:3]", "matches no host"), ("web:!{{ x }}", "templated")],
)
def test_cli_refuses_a_pattern_in_one_message(
    ansible: Ansible, pattern: str, says: str, tmp_path: Path
) -> None:
    proc = cpuaccel(
        "check",
        "-i",
        str(ansible.inventories["ini"]),
        "--limit",
        pattern,
        "--list-hosts",
        cwd=tmp_path,
    )
    assert proc.returncode == EXIT_USAGE and proc.stdout == ""
    assert says in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_implicit_localhost_is_refused_where_ansible_would_add_it(
    ansible: Ansible, inventories: dict[str, Inventory]
) -> None:
    assert ansible.pattern("ini", "localhost").selection == ["localhost"]
    assert ansible.limit("ini", "localhost").selection is None
    for select in (inventories["ini"].select, inventories["ini"].select_pattern):
        assert "implicit localhost" in str(refusal(select, "localhost"))


def test_groups_nested_side_by_side_come_in_the_files_order(tmp_path: Path) -> None:
    """Below the children of a group, Ansible walks a level's groups in the order of a
    set of objects, which changes from one run to the next: here web and db (children
    of two children of all) come in the order the file introduced them."""
    path = tmp_path / "inventory.ini"
    path.write_text(
        textwrap.dedent(
            """\
            [web]
            w1
            w2
            [db]
            d1
            [dc1:children]
            web
            [dc2:children]
            db
            """
        )
    )
    assert names(Inventory.load(path).select(None)) == ["w1", "w2", "d1"]


def test_a_backtracking_regex_is_stopped_in_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(userregex, "SECONDS", 0.5)
    path = tmp_path / "inventory.ini"
    path.write_text("[g]\n" + "a" * 40 + "-x\nweb1\n")
    inventory = Inventory.load(path)
    started = time.monotonic()
    error = refusal(inventory.select, "~(a+)+$")
    assert "took more than 0.5 s" in str(error) and "'(a+)+$'" in str(error.hint)
    # The regex process answers the next pattern, at once.
    assert names(inventory.select("~web")) == ["web1"]
    assert time.monotonic() - started < 5.0


def test_a_subscript_of_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inventory.ini"
    path.write_text("[web]\nweb1\n")
    error = refusal(Inventory.load(path).select, "web[" + "9" * 5000 + "]")
    assert "so no host" in str(error)
