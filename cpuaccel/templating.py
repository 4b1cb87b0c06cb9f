"""Jinja2, sandboxed, for every template cpuaccel renders.

Playbook arguments and conditions (playbook/templar.py), sync's ``--dest``
(projectsync/location.py), and the job files of ``run`` and ``submit`` (templates/*.j2, or the
user's copies) all render here. Templates are data a user may have been handed, so
every environment is Jinja2's immutable sandbox: an expression cannot reach Python's
internals (``cycler.__init__.__globals__``) nor change a variable. Undefined names are
errors (StrictUndefined): a typo must stop with its name, not render an empty path.
``quote`` is the one shell quoting of every word a template writes for a shell.

The expression dialect is Ansible's: its most used filters (``| bool``, ``| default``,
``| quote``, ``| basename``...) and tests (``is changed``).

A render is bounded in size and in time, whatever the template says:

- No value an expression builds, and no render's output, holds more than MAX_CHARS
  characters: the operators that can multiply a size (``*``, ``+``, ``**``, ``%``,
  ``~``) and every filter and method call check the size of what they would make
  before making it, with the ``weight`` of a value (its size as text, each reference
  counted: a list of one string a million times weighs a million strings); a value
  written out (``{{ x }}``), stored in a namespace or returned by an expression is
  weighed too, and a render's text is counted as it is joined. Methods that turn a
  small value into a large one for no templating need (``maketrans``, ``translate``,
  ``expandtabs``, ``fromkeys``, ``to_bytes``) are unsafe attributes.
- A render ends after RENDER_SECONDS: the rendering thread's trace function looks at the
  clock every few thousand steps of Python (a loop of loops over ``range`` would
  otherwise run for hours). ``regex_replace`` runs in the process of cpuaccel.userregex,
  whose own alarm interrupts it after REGEX_SECONDS (Python's regular expressions can
  backtrack for hours, and only a process's main thread can stop them).

Either refusal is a ``RenderLimit`` (a Jinja2 TemplateRuntimeError, so that every
caller's ``except jinja2.TemplateError`` names its template) with the fix as its hint.
"""

from __future__ import annotations

import functools
import json
import math
import os
import posixpath
import re
import string
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.filters import make_attrgetter
from jinja2.nodes import Concat
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

from cpuaccel import userregex
from cpuaccel.connectors.commandline import quote
from cpuaccel.errors import CpuaccelError, UsageError
from cpuaccel.inventory.variables import parse_bool
from cpuaccel.resources import data_dir


class TemplateError(CpuaccelError):
    """An expression or template failed to parse or render (undefined variable ...)."""


# ---------------------------------------------------------------- bounds of a render
MAX_CHARS = 16 * 1024 * 1024  # characters of a value built, and of a render's output
MAX_INT_BITS = 1 << 16  # a number of more bits (some 19,700 digits) is no setting
MAX_COUNT = 100_000  # pieces a filter may be asked to make (as Jinja2's MAX_RANGE)
RENDER_SECONDS = 10.0
REGEX_SECONDS = userregex.SECONDS
_TRACE_EVERY = 4096  # trace events between two looks at the clock
_SIZE_HINT = (
    f"build smaller values: what an expression builds, and a template's output, hold at "
    f"most {MAX_CHARS // (1024 * 1024)} MiB"
)
_TIME_HINT = "render less: fewer or shorter loops (a loop inside a loop multiplies)"
_REGEX_HINT = (
    "rewrite the pattern so that it cannot backtrack: no repetition inside repetition "
    "('a+$', not '(a+)+$'), and no alternatives that match the same text"
)
_UNSAFE_METHODS = frozenset({"maketrans", "translate", "expandtabs", "fromkeys", "to_bytes"})


class RenderLimit(jinja2.TemplateRuntimeError):
    """A render refused for its size or its time: the message says which, the hint the
    fix. A Jinja2 TemplateRuntimeError, so that every caller's handler names its
    template (the job templates' ``template launch.sh.j2: ...``)."""

    def __init__(self, message: str, hint: str = _SIZE_HINT) -> None:
        super().__init__(message)
        self.hint = hint


class _OutOfTime(BaseException):
    """Raised by a render's trace function: a BaseException, so that no ``except
    Exception`` inside a filter or Jinja2 swallows it; the render turns it into a
    RenderLimit."""


def weight(value: Any, limit: int = MAX_CHARS) -> int:
    """What ``value`` weighs as text, counted without making the text, stopping once
    past ``limit``: a string's length, a number's digits (about), a list's or mapping's
    items each time they are held, plus a little a container for its punctuation."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif isinstance(item, Mapping):
            total += 2 * len(item) + 2
            if total <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += len(item) + 2
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, Namespace):
            stack.append(item._Namespace__attrs)
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        else:
            total += 8
        if total > limit:
            return total
    return total


def _check(value: Any, what: str) -> None:
    if weight(value) > MAX_CHARS:
        raise _too_large(what)


def _too_large(what: str) -> RenderLimit:
    return RenderLimit(f"{what} would be more than {MAX_CHARS:,} characters")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse, before it is computed, an operation whose result would be too large."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            sized = isinstance(seq, (str, bytes, list, tuple)) and _is_int(times) and times > 0
            if sized and weight(seq, MAX_CHARS // times + 1) * times > MAX_CHARS:
                raise _too_large(f"{type(seq).__name__} * {times}")
        if _is_int(left) and _is_int(right):
            _check_bits(left.bit_length() + right.bit_length(), "a product")
    elif operator == "+":
        sized = isinstance(left, (str, bytes, list, tuple)) and isinstance(right, type(left))
        if sized and weight(left) + weight(right) > MAX_CHARS:
            raise _too_large(f"{type(left).__name__} + {type(right).__name__}")
    elif operator == "**":
        if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            _check_bits(math.ceil(right * math.log2(abs(left))), f"{left} ** {right}")
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, right)


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise RenderLimit(
            f"{what} would be a number of more than {MAX_INT_BITS:,} bits",
            hint="compute with smaller numbers",
        )


# A conversion of printf-style formatting: %(name)-10.3f, %*d, %%.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")


def _check_printf(text: str, args: Any) -> None:
    """``text % args``: refused when a width or precision, or the whole result, would be
    too large."""
    values = list(args.values()) if isinstance(args, Mapping) else args
    values = list(values) if isinstance(values, tuple) else [values]
    stars = [v for v in values if _is_int(v)]
    budget = len(text) + weight(values)
    for found in _PRINTF.finditer(text):
        for size in found.group(1, 2):
            if size == "*":
                budget += max((abs(v) for v in stars), default=0)
            elif size:
                budget += int(size)
    if budget > MAX_CHARS:
        raise _too_large("the formatted text")


def _check_format(text: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``text.format(*args, **kwargs)``: refused when a width or precision, or the whole
    result (each field at the weight of the argument it names), would be too large."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return  # str.format refuses it itself
    budget, auto = len(text), 0
    for _, name, spec, _ in fields:
        if name is None:
            continue
        first = re.split(r"[.\[]", name, maxsplit=1)[0]
        if first == "":
            first, auto = str(auto), auto + 1
        value = args[int(first)] if first.isdigit() and int(first) < len(args) else None
        budget += weight(value if value is not None else kwargs.get(first))
        for size in re.findall(r"\d+", spec or ""):
            budget += int(size)
        if spec and "{" in spec:  # a width given as an argument
            budget += max((abs(v) for v in (*args, *kwargs.values()) if _is_int(v)), default=0)
    if budget > MAX_CHARS:
        raise _too_large("the formatted text")


class _Bounded(Iterator[Any]):
    """An iterator handed to a filter or a call: what it yields is weighed as it goes,
    since the filter may keep all of it (``| list``, ``| join``)."""

    def __init__(self, items: Iterator[Any], what: str) -> None:
        self._items = items
        self._what = what
        self._total = 0

    def __next__(self) -> Any:
        item = next(self._items)
        self._total += weight(item) + 1
        if self._total > MAX_CHARS:
            raise _too_large(self._what)
        return item


def _checked_args(args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> tuple[Any, ...]:
    """Each argument weighed (an iterator wrapped to be weighed as it is consumed)."""
    out = []
    for value in args:
        if isinstance(value, Iterator) and not isinstance(value, _Bounded):
            value = _Bounded(value, what)
        else:
            _check(value, what)
        out.append(value)
    for name, value in kwargs.items():
        if isinstance(value, Iterator) and not isinstance(value, _Bounded):
            kwargs[name] = _Bounded(value, what)
        else:
            _check(value, what)
    return tuple(out)


def _joined_items(items: Any, separator: str, what: str) -> list[Any]:
    """``items`` as a list, refused as soon as their text joined by ``separator`` would
    be too large (an iterator is not read further)."""
    out, total = [], 0
    for item in items:
        total += weight(item) + len(separator)
        if total > MAX_CHARS:
            raise _too_large(what)
        out.append(item)
    return out


def _replaced_size(text: str, old: str, new: str, count: int | None) -> int:
    found = len(text) + 1 if old == "" else text.count(old)
    if count is not None and count >= 0:
        found = min(found, count)
    return len(text) + found * max(0, len(new) - len(old))


# Filters whose output can outgrow their input: each one's check, given its arguments
# (after the context or environment Jinja2 passes some of them).
def _check_center(value: Any, width: int = 80, *_: Any, **__: Any) -> None:
    if _is_int(width) and width > MAX_CHARS:
        raise _too_large(f"| center({width})")


def _check_indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    step = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    if (str(s).count("\n") + 1) * step + len(str(s)) > MAX_CHARS:
        raise _too_large("| indent")


def _check_format_filter(value: Any, *args: Any, **kwargs: Any) -> None:
    _check_printf(str(value), kwargs or args)


def _check_replace(s: Any, old: Any = "", new: Any = "", count: Any = None, **_: Any) -> None:
    text, many = str(s), count if _is_int(count) else None
    if _replaced_size(text, str(old), str(new), many) > MAX_CHARS:
        raise _too_large("| replace")


def _check_wordwrap(
    s: Any, width: int = 79, long: bool = True, wrap: Any = None, *_: Any, **kw: Any
) -> None:
    wrap = kw.get("wrapstring", wrap)
    if isinstance(wrap, str) and (len(str(s)) + 1) * len(wrap) + len(str(s)) > MAX_CHARS:
        raise _too_large("| wordwrap")


def _check_count(what: str) -> Callable[..., None]:
    def check(value: Any, count: Any = 0, fill_with: Any = None, *_: Any, **kw: Any) -> None:
        filling = kw.get("fill_with", fill_with) is not None or what == "slice"
        if filling and _is_int(count) and count > MAX_COUNT:
            raise RenderLimit(
                f"| {what}({count}) would make more than {MAX_COUNT:,} pieces",
                hint=f"ask | {what} for at most {MAX_COUNT:,}",
            )

    return check


def _check_tojson(value: Any, indent: Any = None, *_: Any, **__: Any) -> None:
    if (_is_int(indent) and indent > 16) or (isinstance(indent, str) and len(indent) > 16):
        raise RenderLimit("| tojson: an indent of more than 16", hint="indent by 16 or fewer")


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center,
    "indent": _check_indent,
    "format": _check_format_filter,
    "replace": _check_replace,
    "wordwrap": _check_wordwrap,
    "slice": _check_count("slice"),
    "batch": _check_count("batch"),
    "tojson": _check_tojson,
}


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with its inputs weighed, and its own check (_FILTER_CHECKS) first."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    check = _FILTER_CHECKS.get(name)
    what = f"the input of | {name}"

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        args = (*args[:skip], *_checked_args(args[skip:], kwargs, what))
        if name == "join":
            separator = args[skip + 1] if len(args) > skip + 1 else kwargs.get("d", "")
            items = _joined_items(args[skip], str(separator), "| join")
            args = (*args[:skip], items, *args[skip + 1 :])
        if check is not None:
            check(*args[skip:], **kwargs)
        return func(*args, **kwargs)

    return bounded


@jinja2.pass_environment
def _sum(
    environment: jinja2.Environment, iterable: Any, attribute: Any = None, start: Any = 0
) -> Any:
    """Jinja2's ``| sum``; a list or tuple start (``sum(start=[])``, Ansible's way to
    flatten) is extended in place, in linear time, where ``sum()`` copies the partial
    result at each step (quadratic, in C, where no time limit can stop it)."""
    if not isinstance(start, (list, tuple)):
        return jinja2.filters.sync_do_sum(environment, iterable, attribute, start)
    items = (
        iterable if attribute is None else map(make_attrgetter(environment, attribute), iterable)
    )
    out = list(start)
    for item in items:
        if not isinstance(item, type(start)):
            raise TypeError(
                f'can only concatenate {type(start).__name__} (not "{type(item).__name__}") '
                f"to {type(start).__name__}"
            )
        out.extend(item)
        if len(out) > MAX_CHARS:
            raise _too_large("| sum")
    return out if isinstance(start, list) else tuple(out)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja2's ``lipsum()``, within bounds."""
    if n > 100 or max > 1000:
        raise RenderLimit("lipsum(): at most 100 paragraphs of 1000 words", hint="ask for less")
    return str(generate_lorem_ipsum(n, html, min, max))


class _Namespace(Namespace):
    """Jinja2's ``namespace()``, whose attributes are weighed when set: the one value a
    loop can grow from one iteration to the next."""

    def __setitem__(self, name: str, value: Any) -> None:
        _check(value, f"namespace attribute {name!r}")
        super().__setitem__(name, value)


class _CodeGenerator(CodeGenerator):
    """Jinja2's code generator, with ``~`` joining through the environment's bounded
    ``join_text`` (Jinja2's own join is a module function no environment can bound)."""

    @optimizeconst
    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.join_text((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedTemplate(jinja2.Template):
    """A template whose ``render`` ends after RENDER_SECONDS."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        return str(within_time(lambda: super(_BoundedTemplate, self).render(*args, **kwargs)))


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, bounded in size (see the module's docstring); time is
    bounded by ``within_time``, around every render (``_BoundedTemplate``)."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})
    code_generator_class = _CodeGenerator
    template_class = _BoundedTemplate

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, **options)
        self.globals.update(namespace=_Namespace, lipsum=_lipsum)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        return attr not in _UNSAFE_METHODS and super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text, by_name = value.__self__, value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            named = args[0] if by_name and args and isinstance(args[0], Mapping) else kwargs
            _check_format(text, () if by_name else args, named)
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = str(getattr(__obj, "__name__", "") or "a callable")
        if isinstance(owner, str) and name == "join" and args:
            args = (_joined_items(args[0], owner, "str.join()"), *args[1:])
        args = _checked_args(args, kwargs, f"an argument of {name}()")
        if isinstance(owner, str):
            if any(_is_int(a) and a > MAX_CHARS for a in (*args, *kwargs.values())):
                raise _too_large(f"str.{name}()")
            if name == "replace" and len(args) >= 2:
                count = args[2] if len(args) > 2 and _is_int(args[2]) else None
                if _replaced_size(owner, str(args[0]), str(args[1]), count) > MAX_CHARS:
                    raise _too_large("str.replace()")
        return super().call(__context, __obj, *args, **kwargs)

    def concat(self, parts: Iterable[str]) -> str:
        """A render's text (and a macro's, a block's), refused once past MAX_CHARS."""
        out, size = [], 0
        for part in parts:
            size += len(part)
            if size > MAX_CHARS:
                raise _too_large("the rendered text")
            out.append(part)
        return "".join(out)

    def join_text(self, parts: Iterable[Any]) -> str:
        """``a ~ b ~ c``: each weighed before it is made text, the whole counted."""
        texts, size = [], 0
        for part in parts:
            _check(part, "an operand of ~")
            text = str(part)
            size += len(text)
            if size > MAX_CHARS:
                raise _too_large("a ~ join")
            texts.append(text)
        return "".join(texts)


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}`` written out: weighed before it is made text."""
    _check(value, "a value written out")
    return value


def within_time(render: Callable[[], Any], seconds: float | None = None) -> Any:
    """``render()``, ended with a RenderLimit after ``seconds`` (RENDER_SECONDS).

    A trace function of this thread alone looks at the clock every _TRACE_EVERY events
    (a call anywhere, a line of the template's own code); a render inside another's, or
    under a debugger or a coverage tool (which trace themselves), runs under their
    watch instead."""
    limit = RENDER_SECONDS if seconds is None else seconds
    if sys.gettrace() is not None:
        return render()
    deadline = time.monotonic() + limit
    events = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal events
        events += 1
        if events % _TRACE_EVERY == 0 and time.monotonic() > deadline:
            raise _OutOfTime
        # Lines are traced in the template's own code (its loops) only: a filter's or
        # Jinja2's code is reached through calls, which are traced everywhere.
        return trace if "__jinja_template__" in frame.f_globals else None

    sys.settrace(trace)
    try:
        return render()
    except _OutOfTime:
        raise RenderLimit(f"rendering took more than {limit:g} s", hint=_TIME_HINT) from None
    finally:
        sys.settrace(None)


def _bool(value: Any) -> bool:
    """Ansible's ``| bool``, strict: a word that is no boolean spelling is an error, not
    False (``ture`` must not quietly turn something off)."""
    if value is None:
        return False
    parsed = parse_bool(value)
    if parsed is None:
        raise TemplateError(f"bool: {value!r} is not a boolean (true/false, yes/no, on/off, 1/0)")
    return parsed


def truth(value: Any) -> bool:
    """A condition's result: strings as ``| bool`` reads them (``"false"`` is False, an
    unknown word an error), anything else as Jinja's truth (``2``, ``[1]`` are true)."""
    return _bool(value) if isinstance(value, str) else bool(value)


def _result_test(key: str) -> Any:
    def test(result: Any) -> bool:
        if not isinstance(result, Mapping):
            raise TemplateError(f"'is {key}' needs a registered result, got {result!r}")
        if key == "succeeded":
            return not result.get("failed", False)
        return bool(result.get(key, False))

    return test


def _regex_replace(value: Any, pattern: str, replacement: str = "") -> str:
    """Ansible's ``| regex_replace``: ``re.sub``, in the regex process (its time bounded),
    its result refused when too large."""
    text = str(value)
    try:
        re.compile(pattern)  # a bad pattern is re's message, here
    except re.error as exc:
        raise jinja2.TemplateRuntimeError(
            f"regex_replace: bad pattern {pattern!r}: {exc}"
        ) from None
    try:
        found = userregex.sub(str(pattern), str(replacement), text, REGEX_SECONDS, MAX_CHARS * 4)
    except userregex.RegexRefused as exc:
        if exc.kind == "large":
            raise _too_large("the result of regex_replace") from None
        if exc.kind == "late":
            raise RenderLimit(
                f"regex_replace: the pattern {pattern!r} took more than {REGEX_SECONDS:g} s "
                f"on {len(text):,} characters",
                hint=_REGEX_HINT,
            ) from None
        if exc.kind == "gone":
            raise RenderLimit(
                "regex_replace: its process gave no answer", hint=_REGEX_HINT
            ) from None
        raise jinja2.TemplateRuntimeError(f"regex_replace: {exc}") from None
    if len(found) > MAX_CHARS:
        raise _too_large("the result of regex_replace")
    return found


def _mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, jinja2.Undefined):
        raise TemplateError(msg or "a mandatory variable is not defined")
    return value


@functools.cache
def environment() -> jinja2.Environment:
    # Sandboxed: playbooks are data a user may have been handed; expressions must not
    # reach Python internals. Immutable: templates read variables, never change them.
    env = BoundedSandbox(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        bool=_bool,
        quote=quote,  # the same filter as run's job templates
        basename=lambda v: posixpath.basename(str(v)),
        dirname=lambda v: posixpath.dirname(str(v)),
        to_json=lambda v: json.dumps(v, sort_keys=True),
        regex_replace=_regex_replace,
        mandatory=_mandatory,
    )
    _bound_filters(env)
    for key in ("changed", "failed", "skipped", "succeeded"):
        env.tests[key] = _result_test(key)
    env.tests["success"] = env.tests["succeeded"]
    return env


def _bound_filters(env: jinja2.Environment) -> None:
    env.filters["sum"] = _sum
    for name, func in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, func)


def describe(exc: Exception) -> str:
    if isinstance(exc, RenderLimit):
        return str(exc)
    if isinstance(exc, jinja2.UndefinedError):
        return f"undefined variable: {exc.message}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def render_text(text: str, variables: Mapping[str, Any]) -> str:
    try:
        return environment().from_string(text).render(**variables)
    except RenderLimit as exc:
        raise TemplateError(str(exc), hint=exc.hint) from None
    except Exception as exc:
        raise TemplateError(describe(exc)) from None


def evaluate_bounded(compiled: Callable[..., Any], variables: Mapping[str, Any]) -> Any:
    """A compiled expression's value, within the time of a render and weighed (it may be
    written out, or sent as JSON, later)."""
    value = within_time(lambda: compiled(**variables))
    if not isinstance(value, jinja2.Undefined):
        _check(value, "the expression's value")
    return value


def file_environment(custom: str | None, *, setting: str, hint: str) -> jinja2.Environment:
    """The shipped templates, under a user's folder of copies (``custom``) when given:
    sandboxed as every template, plain text out (no autoescape), ``quote`` registered.

    ``setting`` names where ``custom`` came from for the error when it is no folder.
    """
    folders = [str(data_dir("templates"))]
    if custom:
        custom = os.path.expanduser(custom)
        if not os.path.isdir(custom):
            raise UsageError(f"{setting} is {custom}, which is not a folder", hint=hint)
        folders.insert(0, custom)
    env = BoundedSandbox(
        loader=jinja2.FileSystemLoader(folders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["quote"] = quote
    _bound_filters(env)
    return env
