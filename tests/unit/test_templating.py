"""The one sandboxed Jinja2 (cpuaccel.templating), bounded: an expression that would
build a value larger than MAX_CHARS is refused before the value is made, and a render
(or a regex_replace) that runs past its time ends with an error and the fix.

Each test first sets the bound it relies on (monkeypatch.setattr refuses a name the
module does not have): without the bounds the test stops there, before rendering an
expression that would take gigabytes or hours."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuaccel import templating
from cpuaccel.templating import TemplateError, render_text


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(templating, "RENDER_SECONDS", 5.0)
    monkeypatch.setattr(templating, "REGEX_SECONDS", 0.5)
    yield


def refused(text: str, **variables: object) -> TemplateError:
    """The error of rendering ``text``, which must come fast and without allocating the
    value the expression asked for."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TemplateError) as caught:
            render_text(text, variables)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 4.0
    assert peak < 64 * 1024 * 1024, f"{peak:,} bytes allocated before the refusal"
    return caught.value


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{{ 'a' * 4000000000 }}", "str * 4000000000 would be more than 16,777,216"),
        ("{{ 4000000000 * 'a' }}", "str * 4000000000 would be more than"),
        ("{{ [1] * 10 ** 9 }}", "list * 1000000000 would be more than"),
        ("{{ ['x' * 1000000] * 100 }}", "list * 100 would be more than"),
        ("{{ 'a' * 10000000 + 'b' * 10000000 }}", "str + str would be more than"),
        ("{{ 2 ** 10000000 }}", "2 ** 10000000 would be a number of more than 65,536 bits"),
        ("{{ '%4000000000s' % 'a' }}", "the formatted text would be more than"),
        ("{{ '%*s' % (4000000000, 'a') }}", "the formatted text would be more than"),
        ("{{ '{:>4000000000}'.format('a') }}", "the formatted text would be more than"),
        ("{{ 'a' | center(4000000000) }}", "| center(4000000000) would be more than"),
        ("{{ 'a'.center(4000000000) }}", "str.center() would be more than"),
        ("{{ ('\n' * 1000) | indent(4000000000) }}", "| indent would be more than"),
        ("{{ ('a' * 1000000) | replace('', 'b' * 1000000) }}", "| replace would be more than"),
        ("{{ ('a' * 1000000).replace('a', 'b' * 1000) }}", "str.replace() would be more than"),
        ("{{ range(1000) | map('center', 100000) | join }}", "| join would be more than"),
        ("{{ ','.join(range(1000) | map('center', 100000)) }}", "str.join() would be more than"),
        ("{{ [1] | batch(4000000000, 0) | list }}", "| batch(4000000000) would make more than"),
        ("{{ [1] | slice(100000000) | list }}", "| slice(100000000) would make more than"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "a ~ join would be more than",
        ),
        (
            "{% set ns = namespace(s=['a' * 1000000]) %}{% for i in range(64) %}"
            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "list + list would be more than",
        ),
        (
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            "the rendered text would be more than",
        ),
        ("{{ [x] * 100 }}", "list * 100 would be more than"),
    ],
)
def test_a_value_too_large_is_refused_before_it_is_made(
    bounded: None, text: str, says: str
) -> None:
    error = refused(text, x="y" * 1_000_000)
    assert says in error.message
    assert error.hint  # the fix: smaller values, fewer pieces, smaller numbers


@pytest.mark.parametrize("method", ["expandtabs(8)", "maketrans('a', 'b')", "translate({})"])
def test_methods_that_only_grow_a_value_are_unsafe(bounded: None, method: str) -> None:
    error = refused("{{ 'x'." + method + " }}")
    assert "is unsafe" in error.message
    assert "unsafe" in refused("{{ (1).to_bytes(4000000000, 'big') }}").message
    assert "at most 100 paragraphs" in refused("{{ lipsum(1000000000) }}").message


def test_a_render_past_its_time_ends_with_the_fix(
    bounded: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loops of 100,000: some 10^10 steps, hours; ended after the limit."""
    monkeypatch.setattr(templating, "RENDER_SECONDS", 0.3)
    started = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        render_text(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", {}
        )
    assert time.monotonic() - started < 3.0
    assert caught.value.message == "rendering took more than 0.3 s"
    assert caught.value.hint and "loop inside a loop" in caught.value.hint
    # The thread is not traced any more, and the next render is a normal one.
    assert render_text("{{ 1 + 1 }}", {}) == "2"


def test_a_catastrophic_regex_replace_ends_with_the_fix(bounded: None) -> None:
    """'(a+)+$' on 40 a's and a '!' backtracks for hours; its process stops it."""
    started = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        render_text("{{ ('a' * 40 ~ '!') | regex_replace('(a+)+$', '') }}", {})
    assert time.monotonic() - started < 3.0
    assert caught.value.message == (
        "regex_replace: the pattern '(a+)+$' took more than 0.5 s on 41 characters"
    )
    assert caught.value.hint and "'a+$', not '(a+)+$'" in caught.value.hint
    # The process answers the next one at once.
    started = time.monotonic()
    assert render_text("{{ 'a-b-c' | regex_replace('-+', '_') }}", {}) == "a_b_c"
    assert time.monotonic() - started < 1.0


def test_a_regex_replace_whose_result_is_too_large_is_refused(
    bounded: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result (100 million characters) is made in the regex process, whose memory
    is bounded; this process never reads it. The memory bound is what refuses it: the
    time bound is widened, so that a busy machine cannot make it the time bound's."""
    monkeypatch.setattr(templating, "REGEX_SECONDS", 3.0)
    text = "{{ ('a' * 100000) | regex_replace('a', 'b' * 1000) }}"
    assert "would be more than" in refused(text).message


@pytest.mark.parametrize(
    ("text", "out"),
    [
        ("{{ '%d bytes' % 64000000000 }}", "64000000000 bytes"),
        ("{{ '{:,}'.format(64000000000) }}", "64,000,000,000"),
        ("{{ '%-8s|' % 'ab' }}", "ab      |"),
        ("{{ 'ab' | center(6) }}", "  ab  "),
        ("{{ [[1], [2, 3]] | sum(start=[]) }}", "[1, 2, 3]"),
        ("{{ [{'a': [1]}, {'a': [2]}] | sum(attribute='a', start=[]) }}", "[1, 2]"),
        ("{{ [1, 2] | sum }}", "3"),
        ("{{ range(3) | map('string') | join(',') }}", "0,1,2"),
        ("{{ '-'.join(['a', 'b']) }}", "a-b"),
        ("{{ 'a b'.replace(' ', '_') }}", "a_b"),
        ("{{ 'v1.2.3' | regex_replace('^v(\\\\d+)\\\\..*$', '\\\\1') }}", "1"),
        (
            "{% set ns = namespace(n=0) %}{% for i in range(5) %}"
            "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
            "10",
        ),
        ("{{ 'a' ~ 1 ~ [2] }}", "a1[2]"),
        ("{{ 2 ** 64 }}", str(2**64)),
        ("{{ 'x' * 3 }}", "xxx"),
        ("{{ {'a': 1} | tojson }}", '{"a": 1}'),
    ],
)
def test_ordinary_expressions_render_as_before(text: str, out: str) -> None:
    assert render_text(text, {}) == out


def test_a_sum_of_lists_is_linear_and_keeps_sums_type_errors(bounded: None) -> None:
    started = time.monotonic()
    assert render_text("{{ ([[1]] * 100000) | sum(start=[]) | length }}", {}) == "100000"
    assert time.monotonic() - started < 3.0  # sum() copies the partial list each step
    with pytest.raises(TemplateError, match='can only concatenate list \\(not "tuple"\\)'):
        render_text("{{ [[1], (2,)] | sum(start=[]) }}", {})


def test_job_templates_are_bounded_as_playbooks_are(bounded: None, tmp_path: Path) -> None:
    (tmp_path / "hostfile.j2").write_text("{{ 'a' * 4000000000 }}\n")
    env = templating.file_environment(str(tmp_path), setting="cpuaccel_templates", hint="x")
    with pytest.raises(templating.RenderLimit, match="str \\* 4000000000 would be more than"):
        env.get_template("hostfile.j2").render()


def test_weight_counts_each_reference() -> None:
    big = "x" * 1000
    assert templating.weight(big) == 1000
    assert templating.weight([big] * 1000) > 1_000_000
    assert templating.weight({"a": [big, big]}) > 2000
    assert templating.weight([big] * 10**6, limit=5000) <= 10**6 + 5000  # stops early
