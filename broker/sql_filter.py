"""RocketMQ's SQL92 message filter: compiled once per subscription, evaluated per message.

A consumer that subscribes with ``expressionType=SQL92`` hands the broker an expression
such as ``a > 5 AND TAGS IN ('x', 'y')``; the broker delivers only the messages whose
properties make it TRUE. ``compile_filter`` turns the text into a ``Filter`` whose
``matches(properties)`` answers that for one message's property map (user properties plus
the system ones RocketMQ keeps there, e.g. ``TAGS`` and ``KEYS``). Any text that cannot be
compiled raises ``SqlFilterError``, which the broker answers with SUBSCRIPTION_PARSE_FAILED.

Why follow RocketMQ so closely: ledgermq's consumers are RocketMQ clients, and an
expression must select the same messages here as on an Apache RocketMQ broker, quirks
included. The rules below were read from Apache RocketMQ's ``filter`` module (4.9.x, and
5.x for the string operators): ``SelectorParser.jj`` and the generated ``SelectorParser``,
``ComparisonExpression``, ``LogicExpression``, ``UnaryExpression``, ``ConstantExpression``,
``PropertyExpression``, the tests ``ExpressionTest``/``ParserTest``, and the broker's
``ExpressionMessageFilter.isMatchedByCommitLog``; they were then checked by running the same
expressions and property maps through RocketMQ's own filter classes.

Grammar (keywords case-insensitive; ``--`` line and ``/* */`` block comments allowed):
  or       := and (OR and)*
  and      := equality (AND equality)*
  equality := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
  comparison := unary ( ('>'|'>='|'<'|'<=') unary | [NOT] BETWEEN unary AND unary
              | [NOT] IN '(' string (',' string)* ')' | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string )*
  unary    := '+' unary | '-' unary | NOT unary | primary
  primary  := string | integer | float | TRUE | FALSE | NULL | property | '(' or ')'
Property names are ``[A-Za-z_$][A-Za-z0-9_$]*`` (no dots: RocketMQ's lexer has none). Note
that NOT is a *unary* operator binding tighter than comparisons, as in RocketMQ: ``NOT a > 5``
does not parse (a boolean cannot be compared) and ``NOT a = 'x'`` means ``(NOT a) = 'x'``;
write ``NOT (a > 5)``. A bare property in a boolean position (``a``, ``NOT a``, ``a AND ...``)
is cast as in RocketMQ: UNKNOWN when missing, otherwise FALSE (a string is no boolean).

Typing. Property values are strings. A comparison converts the property value to the type
of the other operand, as Java's ``Integer.valueOf``/``Long.valueOf``/``Double.valueOf``/
``Boolean.valueOf`` would: against ``5`` (an int) the value must be a 32-bit integer, against
``3000000000`` a 64-bit one, against ``5.5`` any Java double (``"1e3"``, ``" 7 "``, ``"NaN"``);
``a > b`` between two properties compares both as doubles; ``=`` between two strings is
plain string equality. ``>``, ``<`` etc. accept only numbers (``a > 'x'`` is a compile error).
``a = TRUE`` holds when the value is ``true`` in any case; ``a = FALSE`` for any other value.

Null and three-valued logic (LogicExpression, ComparisonExpression):
  * a missing property is NULL; ``>``/``<``/``BETWEEN``/``IN``/``NOT IN`` with a NULL are
    UNKNOWN; ``IS NULL`` is TRUE; CONTAINS/STARTSWITH/ENDSWITH (and their NOT forms) are FALSE.
  * ``x = y``: UNKNOWN when x is NULL and y is not, FALSE when only y is NULL, TRUE when both
    are (so ``'v' <> a`` is TRUE for a missing ``a``, while ``a <> 'v'`` is UNKNOWN).
  * NOT UNKNOWN is UNKNOWN; AND is FALSE if either side is FALSE, OR is TRUE if either side
    is TRUE, otherwise UNKNOWN if either side is. ``a > 1 OR b = 'x'`` matches a message
    without ``a`` whose ``b`` is ``'x'``.
  * A message matches only when the result is TRUE.
  * Where Java throws while evaluating (a value that does not convert, e.g. ``a > 5`` with
    ``a = 'abc'`` or ``a = '5.5'``), RocketMQ's broker catches it and does not deliver the
    message: the *whole* expression fails, even inside an OR whose other side is TRUE. Here
    too: evaluation stops and ``matches`` returns False. Operands are evaluated left to
    right and AND/OR short-circuit exactly as in Java, so the same messages fail.
Compile-time checks that RocketMQ makes are made here too: ``a = NULL`` (use IS NULL),
comparing a string, boolean or NULL literal with ``>``, a BETWEEN whose literal bounds are
reversed, IN on anything but a property, a non-boolean whole expression (``5``), integer
literals beyond 64 bits, and float literals that are 0 or overflow (RocketMQ rejects values
below ``Double.MIN_VALUE``, so ``a > 0.0`` fails; write ``a > 0``).

Deviations, all of them rejections of text that RocketMQ accepts or would exhaust memory on:
  * RocketMQ's grammar has no end-of-input rule, so it silently drops everything after the
    first token that cannot continue the expression (``a > 1 b < 2`` means ``a > 1``;
    ``(a > 1))`` parses). Here trailing text is an error.
  * Bounds RocketMQ does not have: ``MAX_EXPRESSION_LENGTH`` characters, ``MAX_DEPTH``
    levels of nesting, ``MAX_IN_LIST_SIZE`` values in one IN list.
  * CONTAINS/STARTSWITH/ENDSWITH come from RocketMQ 5.x; as there, they are reserved words.

No eval/exec: the expression is parsed by hand and compiled into Python closures.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = [
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "MAX_IN_LIST_SIZE",
    "Filter",
    "SqlFilterError",
    "compile_filter",
]

MAX_EXPRESSION_LENGTH: Final = 4096  # characters; RocketMQ subscriptions are a line or two
MAX_DEPTH: Final = 64  # nesting of parentheses, unary operators and chained comparisons
MAX_IN_LIST_SIZE: Final = 512  # values in one IN (...) list

_Props = Mapping[str, str]
_Fn = Callable[[_Props], Any]  # evaluates one operand: a Java value as a Python one, or None


class SqlFilterError(ValueError):
    """The expression cannot be compiled.

    ``reason`` says what, ``column`` where: a 1-based character offset from the start of the
    expression (newlines count as one character), or None when the whole text is at fault.
    """

    def __init__(self, reason: str, *, expression: str = "", column: int | None = None) -> None:
        self.reason = reason
        self.expression = expression
        self.column = column
        where = f" at column {column}" if column is not None else ""
        super().__init__(f"invalid SQL92 filter: {reason}{where}")


class _Abort(Exception):
    """Evaluation reached what throws in RocketMQ (NumberFormatException, ClassCastException)."""


# --------------------------------------------------------------------------------------
# Java values: the conversions and comparisons of ComparisonExpression.__compare
# --------------------------------------------------------------------------------------

# The Java type an operand has whenever it is not null; it is known at compile time, since
# properties are always strings and every number comes from a literal.
_STR: Final = "String"
_INT: Final = "Integer"
_LONG: Final = "Long"
_DOUBLE: Final = "Double"
_BOOL: Final = "Boolean"
_NULL: Final = "null"  # always null (NULL, or a negated non-number)
_NUMERIC: Final = (_INT, _LONG, _DOUBLE)

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_BOUNDS: Final = {_INT: (_INT_MIN, _INT_MAX), _LONG: (_LONG_MIN, _LONG_MAX)}


def _java_integer(s: str, lo: int, hi: int) -> int:
    """``Integer.valueOf``/``Long.valueOf``: optional sign, decimal digits, within [lo, hi]."""
    if s.isascii():
        if not s.isdigit() and (len(s) < 2 or s[0] not in "+-" or not s[1:].isdigit()):
            raise _Abort
        if len(s) > 20:  # Java takes any number of leading zeros; int() refuses > 4300 digits
            sign = s[0] if s[0] in "+-" else ""
            digits = s[len(sign) :].lstrip("0") or "0"
            if len(digits) > 19:
                raise _Abort
            s = sign + digits
    else:  # Character.digit accepts any Unicode decimal digit, but one UTF-16 unit at a time
        sign = s[0] if s[:1] in ("+", "-") else ""
        digits = s[len(sign) :]
        if not digits.isdecimal() or max(digits) > "\uffff":
            raise _Abort
        digits = "".join(str(unicodedata.decimal(c)) for c in digits).lstrip("0") or "0"
        if len(digits) > 19:
            raise _Abort
        s = sign + digits
    n = int(s)
    if n < lo or n > hi:
        raise _Abort
    return n


def _java_int(s: str) -> int:
    return _java_integer(s, _INT_MIN, _INT_MAX)


def _java_long(s: str) -> int:
    return _java_integer(s, _LONG_MIN, _LONG_MAX)


_JAVA_TRIM: Final = "".join(map(chr, range(0x21)))  # String.trim() drops chars <= U+0020
_DECIMAL_FLOAT = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_HEX_FLOAT = re.compile(
    r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP]([+-]?[0-9]+))[fFdD]?"
)


def _java_double(s: str) -> float:
    """``Double.valueOf``: Java's floating-point syntax (not Python's: no ``_``, ``inf``)."""
    if s.isascii() and s.isdigit():
        return float(s)
    t = s.strip(_JAVA_TRIM)
    if _DECIMAL_FLOAT.fullmatch(t):
        if t.endswith("NaN"):
            return math.nan
        if t.endswith("Infinity"):
            return -math.inf if t[0] == "-" else math.inf
        return float(t.rstrip("fFdD"))
    m = _HEX_FLOAT.fullmatch(t)
    if m is None:
        raise _Abort
    sign, body, exponent = m.groups()
    if len(exponent.lstrip("+-").lstrip("0")) > 9:  # Java: past an int, the result is 0 or infinity
        mantissa = body[: body.lower().index("p")]
        nonzero = any(c not in "0." for c in mantissa)
        value = math.inf if nonzero and not exponent.startswith("-") else 0.0
    else:
        try:
            value = float.fromhex(body)
        except OverflowError:
            value = math.inf
    return -value if sign == "-" else value


def _java_boolean(s: str) -> bool:
    """``Boolean.valueOf``: true for ``true`` in any case, false for everything else."""
    return len(s) == 4 and s.lower() == "true"


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _double_cmp(a: float, b: float) -> int:
    """``Double.compare``: -0.0 < 0.0, and NaN equals itself and is above everything."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        return _cmp(math.copysign(1.0, a), math.copysign(1.0, b)) if a == 0.0 else 0
    return _cmp(math.isnan(a), math.isnan(b))


def _abort_cmp(a: Any, b: Any) -> int:
    raise _Abort  # Boolean vs String: ClassCastException in __compare


def _less_cmp(a: Any, b: Any) -> int:
    return -1  # unrelated types: __compare answers -1


def _comparator(lt: str, rt: str) -> Callable[[Any, Any], int]:
    """``__compare(lv, rv)`` for non-null values of Java types lt and rt (string conversion on)."""
    if lt == rt:
        return _double_cmp if lt == _DOUBLE else _cmp
    if lt == _BOOL:
        return _abort_cmp if rt == _STR else _less_cmp
    if lt in (_INT, _LONG):
        if rt in (_INT, _LONG):
            return _cmp
        if rt == _DOUBLE:
            return lambda a, b: _double_cmp(float(a), b)
        if rt == _STR:
            conv = _java_int if lt == _INT else _java_long
            return lambda a, b: _cmp(a, conv(b))
        return _less_cmp
    if lt == _DOUBLE:
        if rt in (_INT, _LONG):
            return lambda a, b: _double_cmp(a, float(b))
        if rt == _STR:
            return lambda a, b: _double_cmp(a, _java_double(b))
        return _less_cmp
    if lt == _STR:
        if rt == _BOOL:
            return lambda a, b: _cmp(_java_boolean(a), b)
        if rt == _INT:
            return lambda a, b: _cmp(_java_int(a), b)
        if rt == _LONG:
            return lambda a, b: _cmp(_java_long(a), b)
        if rt == _DOUBLE:
            return lambda a, b: _double_cmp(_java_double(a), b)
    return _less_cmp


def _strings_as_doubles(a: str, b: str) -> int:
    """``a > b`` between two strings: both through ``Double.valueOf``."""
    return _double_cmp(_java_double(a), _java_double(b))


_ORDER_OPS: Final = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


# --------------------------------------------------------------------------------------
# Compiled expression nodes
# --------------------------------------------------------------------------------------

_CONST, _PROP, _BOOLEAN, _OTHER = "constant", "property", "boolean", "value"


class _Expr:
    """One parsed operand and its compiled closure.

    ``kind`` mirrors the Java class that RocketMQ's checks look at: a constant (``literal``
    when written as such, not produced by negation), a property, a boolean expression, or
    another value (a negated non-constant). ``jtype`` is its Java type when not null.
    """

    __slots__ = ("kind", "jtype", "literal", "value", "name", "fn", "depth", "pos", "logic", "operands")

    def __init__(
        self,
        kind: str,
        jtype: str,
        fn: _Fn,
        pos: int,
        depth: int = 1,
        *,
        literal: bool = False,
        value: Any = None,
        name: str = "",
        logic: str = "",
        operands: tuple[_Expr, ...] = (),
    ) -> None:
        self.kind = kind
        self.jtype = jtype
        self.fn = fn
        self.pos = pos
        self.depth = depth
        self.literal = literal
        self.value = value
        self.name = name
        self.logic = logic  # "AND"/"OR" (operands kept for flattening), or "NOT"
        self.operands = operands

    @property
    def is_boolean(self) -> bool:  # Java: instanceof BooleanExpression
        return self.kind == _BOOLEAN or (
            self.kind == _CONST and self.literal and self.jtype in (_BOOL, _NULL)
        )

    def describe(self) -> str:
        if self.kind == _PROP:
            return f"property {self.name}"
        if self.kind == _CONST and self.literal:
            if self.jtype == _STR:
                text = str(self.value).replace("'", "''")
                return "string '" + (text if len(text) <= 40 else text[:37] + "...") + "'"
            if self.jtype == _NULL:
                return "NULL"
            if self.jtype == _BOOL:
                return "TRUE" if self.value else "FALSE"
            return f"number {self.value!r}"
        return "a boolean expression" if self.is_boolean else "a computed value"


def _constant_fn(value: Any) -> _Fn:
    return lambda p: value


def _none_fn(p: _Props) -> None:
    return None


def _property_fn(name: str) -> _Fn:
    return operator.methodcaller("get", name)


# --------------------------------------------------------------------------------------
# Lexer
# --------------------------------------------------------------------------------------

_KEYWORDS: Final = frozenset(
    ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH")
)
_STRING_OPS: Final = ("CONTAINS", "STARTSWITH", "ENDSWITH")

_TOKEN = re.compile(
    "|".join(
        (
            r"(?P<ws>[ \t\n\r\f]+)",
            r"(?P<comment>/\*[^*]*\*+(?:[^*/][^*]*\*+)*/)",  # -- line comments: see _tokenize
            r"(?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)",
            r"(?P<int>0|[1-9][0-9]*[lL]?)",
            r"(?P<str>'(?:[^']|'')*')",
            r"(?P<id>[A-Za-z_$][A-Za-z0-9_$]*)",
            r"(?P<op><>|<=|>=|[=<>(),+-])",
        )
    )
)

_EOF: Final = "end"


class _Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind = kind  # "kw" (text upper-cased), "id", "str", "int", "float", "op", or _EOF
        self.text = text
        self.pos = pos

    def is_kw(self, *words: str) -> bool:
        return self.kind == "kw" and self.text in words

    def is_op(self, *ops: str) -> bool:
        return self.kind == "op" and self.text in ops

    def describe(self) -> str:
        if self.kind == _EOF:
            return "the end of the expression"
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return text if self.kind == "kw" else repr(text)


_LEX_HINTS: Final = {
    "!": " (not-equal is written <>)",
    '"': " (string literals take single quotes)",
    ".": " (property names hold letters, digits, '_' and '$' only)",
}


_NEWLINE = re.compile(r"\r\n|\n|\r")


def _tokenize(src: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, end = 0, len(src)
    newline: re.Match[str] | None = _NEWLINE.search(src)  # the next newline at or after pos
    while pos < end:
        if src.startswith("--", pos):  # a line comment, if a newline ends it; else a minus
            if newline is not None and newline.start() < pos:
                newline = _NEWLINE.search(src, pos)
            if newline is not None:
                pos = newline.end()
                continue
        m = _TOKEN.match(src, pos)
        if m is None:
            if src[pos] == "'":
                raise SqlFilterError("unterminated string literal", expression=src, column=pos + 1)
            if src.startswith("/*", pos):
                raise SqlFilterError("unterminated /* comment", expression=src, column=pos + 1)
            ch = src[pos]
            raise SqlFilterError(
                f"unexpected character {ch!r}{_LEX_HINTS.get(ch, '')}", expression=src, column=pos + 1
            )
        kind = m.lastgroup
        text = m.group()
        if kind == "id":
            upper = text.upper()
            if upper in _KEYWORDS:
                kind, text = "kw", upper
        if kind not in ("ws", "comment"):
            tokens.append(_Token(str(kind), text, pos))
        pos = m.end()
    tokens.append(_Token(_EOF, "", end))
    return tokens


# --------------------------------------------------------------------------------------
# Parser: recursive descent in RocketMQ's rule order, building closures as it goes
# --------------------------------------------------------------------------------------


def _not_hint(e: _Expr) -> str:
    if e.logic != "NOT":
        return ""
    return " (NOT applies to the operand right after it, as in RocketMQ: write NOT (a > 1), a NOT IN (...))"


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.tokens = _tokenize(src)
        self.i = 0
        self.nesting = 0
        self.names: set[str] = set()

    # -- helpers -------------------------------------------------------------------------

    def error(self, reason: str, pos: int) -> SqlFilterError:
        return SqlFilterError(reason, expression=self.src, column=pos + 1)

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != _EOF:
            self.i += 1
        return tok

    def unexpected(self, tok: _Token, wanted: str) -> SqlFilterError:
        return self.error(f"unexpected {tok.describe()}; expected {wanted}", tok.pos)

    def expect_op(self, op: str, wanted: str) -> _Token:
        tok = self.advance()
        if not tok.is_op(op):
            raise self.unexpected(tok, wanted)
        return tok

    def expect_string(self, after: str) -> str:
        tok = self.advance()
        if tok.kind != "str":
            raise self.unexpected(tok, f"a string literal after {after}")
        return tok.text[1:-1].replace("''", "'")

    def checked(self, e: _Expr) -> _Expr:
        if e.depth > MAX_DEPTH:
            raise self.error(f"expression nests deeper than {MAX_DEPTH} levels", e.pos)
        return e

    def enter(self, tok: _Token) -> None:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"expression nests deeper than {MAX_DEPTH} levels", tok.pos)

    # -- grammar -------------------------------------------------------------------------

    def parse(self) -> _Expr:
        if self.peek().kind == _EOF:
            raise SqlFilterError("empty expression", expression=self.src)
        e = self.parse_or()
        tok = self.peek()
        if tok.kind != _EOF:
            if tok.is_op(")"):
                raise self.error("unbalanced ')': no '(' is open", tok.pos)
            raise self.unexpected(tok, "AND, OR or the end of the expression")
        return self.as_boolean(e)

    def parse_or(self) -> _Expr:
        return self.parse_logic("OR", self.parse_and)

    def parse_and(self) -> _Expr:
        return self.parse_logic("AND", self.parse_equality)

    def parse_logic(self, word: str, parse_operand: Callable[[], _Expr]) -> _Expr:
        first = parse_operand()
        if not self.peek().is_kw(word):
            return first
        operands = [self.as_boolean(first)]
        while self.peek().is_kw(word):
            self.advance()
            operands.append(self.as_boolean(parse_operand()))
        return self.checked(_logic(word, operands, first.pos))

    def parse_equality(self) -> _Expr:
        left = self.parse_comparison()
        while True:
            tok = self.peek()
            if tok.is_op("=", "<>"):
                self.advance()
                right = self.parse_comparison()
                left = self.checked(self.equal(left, right, tok))
                if tok.text == "<>":
                    left = self.checked(_not(left, tok.pos))
            elif tok.is_kw("IS"):
                self.advance()
                nxt = self.advance()
                negated = nxt.is_kw("NOT")
                if negated:
                    nxt = self.advance()
                if not nxt.is_kw("NULL"):
                    raise self.unexpected(nxt, "NULL or NOT NULL after IS")
                left = self.checked(_is_null(left, negated, tok.pos))
            else:
                return left

    def parse_comparison(self) -> _Expr:
        left = self.parse_unary()
        while True:
            tok = self.peek()
            negated = tok.is_kw("NOT") and self.peek(1).is_kw("BETWEEN", "IN", *_STRING_OPS)
            if negated:
                self.advance()
                tok = self.peek()
            if tok.is_op(">", ">=", "<", "<="):
                self.advance()
                left = self.relational(tok.text, left, self.parse_unary(), tok.pos)
            elif tok.is_kw(*_STRING_OPS):
                self.advance()
                search = self.expect_string(tok.text)
                left = self.checked(_string_test(tok.text, negated, left, search, tok.pos))
            elif tok.is_kw("BETWEEN"):
                self.advance()
                low = self.parse_unary()
                and_tok = self.advance()
                if not and_tok.is_kw("AND"):
                    raise self.unexpected(and_tok, "AND between the bounds of BETWEEN")
                left = self.between(left, low, self.parse_unary(), negated, tok.pos)
            elif tok.is_kw("IN"):
                self.advance()
                left = self.in_list(left, negated, tok)
            else:
                return left

    def parse_unary(self) -> _Expr:
        prefixes: list[_Token] = []  # read iteratively: a long chain of NOTs costs no recursion
        while self.peek().is_op("+", "-") or self.peek().is_kw("NOT"):
            tok = self.advance()
            if not tok.is_op("+"):  # unary plus returns its operand unchanged
                prefixes.append(tok)
                if len(prefixes) > MAX_DEPTH:
                    raise self.error(f"expression nests deeper than {MAX_DEPTH} levels", tok.pos)
        e = self.parse_primary()
        for tok in reversed(prefixes):
            if tok.is_op("-"):
                e = self.checked(_negate(e, tok.pos))
            else:
                e = self.checked(_not(self.as_boolean(e), tok.pos))
        return e

    def parse_primary(self) -> _Expr:
        tok = self.advance()
        kind = tok.kind
        if kind == "str":
            text = tok.text[1:-1].replace("''", "'")
            return _Expr(_CONST, _STR, _constant_fn(text), tok.pos, literal=True, value=text)
        if kind == "int":
            return self.integer_literal(tok)
        if kind == "float":
            return self.float_literal(tok)
        if kind == "id":
            self.names.add(tok.text)
            return _Expr(_PROP, _STR, _property_fn(tok.text), tok.pos, name=tok.text)
        if tok.is_kw("TRUE", "FALSE", "NULL"):
            value = {"TRUE": True, "FALSE": False, "NULL": None}[tok.text]
            jtype = _NULL if value is None else _BOOL
            return _Expr(_CONST, jtype, _constant_fn(value), tok.pos, literal=True, value=value)
        if tok.is_op("("):
            self.enter(tok)
            e = self.parse_or()
            closing = self.advance()
            if not closing.is_op(")"):
                if closing.kind == _EOF:
                    raise self.error("unbalanced '(': missing ')'", tok.pos)
                raise self.unexpected(closing, "')' to close the '(' at column " + str(tok.pos + 1))
            self.nesting -= 1
            return e
        raise self.unexpected(tok, "a property name, a literal, '(' or NOT")

    def integer_literal(self, tok: _Token) -> _Expr:
        digits = tok.text.rstrip("lL")
        if len(digits) > 19 or int(digits) > _LONG_MAX:
            raise self.error(f"integer literal {tok.describe()} does not fit in a 64-bit long", tok.pos)
        n = int(digits)
        jtype = _INT if n <= _INT_MAX else _LONG
        return _Expr(_CONST, jtype, _constant_fn(n), tok.pos, literal=True, value=n)

    def float_literal(self, tok: _Token) -> _Expr:
        x = float(tok.text)
        if x == 0.0 or math.isinf(x):  # ConstantExpression.createFloat: MIN_VALUE <= x <= MAX_VALUE
            what = "is zero (RocketMQ rejects it; write 0)" if x == 0.0 else "overflows a double"
            raise self.error(f"floating-point literal {tok.describe()} {what}", tok.pos)
        return _Expr(_CONST, _DOUBLE, _constant_fn(x), tok.pos, literal=True, value=x)

    # -- RocketMQ's checks and constructors ----------------------------------------------

    def as_boolean(self, e: _Expr) -> _Expr:
        """SelectorParser.asBooleanExpression: booleans as they are, a property cast."""
        if e.is_boolean:
            return e
        if e.kind == _PROP:
            return self.checked(_boolean_cast(e))
        raise self.error(f"{e.describe()} is not a boolean expression", e.pos)

    def check_orderable(self, e: _Expr, op: str) -> None:
        """ComparisonExpression.checkLessThanOperand: only numbers go with < <= > >=."""
        if (e.kind == _CONST and e.literal and e.jtype not in _NUMERIC) or e.kind == _BOOLEAN:
            raise self.error(
                f"{e.describe()} cannot be compared with {op}: only numbers can{_not_hint(e)}", e.pos
            )

    def relational(self, op: str, left: _Expr, right: _Expr, pos: int) -> _Expr:
        self.check_orderable(left, op)
        self.check_orderable(right, op)
        return self.checked(_relational(op, left, right, pos))

    def equal(self, left: _Expr, right: _Expr, tok: _Token) -> _Expr:
        for e in (left, right):  # checkEqualOperand
            if e.kind == _CONST and e.literal and e.jtype == _NULL:
                raise self.error(
                    f"NULL cannot be compared with {tok.text}; use IS NULL or IS NOT NULL", e.pos
                )
        literals = left.kind == _CONST and left.literal and right.kind == _CONST and right.literal
        if literals and left.is_boolean and not right.is_boolean:  # checkEqualOperandCompatability
            raise self.error(f"{left.describe()} cannot be compared with {right.describe()}", tok.pos)
        return _equal(left, right, tok.pos)

    def between(self, value: _Expr, low: _Expr, high: _Expr, negated: bool, pos: int) -> _Expr:
        for e in (value, low, high):
            self.check_orderable(e, "NOT BETWEEN" if negated else "BETWEEN")
        if not negated and low.kind == _CONST and low.literal and high.kind == _CONST and high.literal:
            if low.jtype == _NULL or high.jtype == _NULL:
                raise self.error("the bounds of BETWEEN cannot be NULL", pos)
            try:
                reversed_bounds = _comparator(high.jtype, low.jtype)(high.value, low.value) < 0
            except _Abort:
                reversed_bounds = True
            if reversed_bounds:
                raise self.error(
                    f"BETWEEN's lower bound ({low.describe()}) must not exceed its upper bound"
                    f" ({high.describe()})",
                    pos,
                )
        if negated:  # createNotBetween: value < low OR value > high
            parts = [self.relational("<", value, low, pos), self.relational(">", value, high, pos)]
            return self.checked(_logic("OR", parts, pos))
        parts = [self.relational(">=", value, low, pos), self.relational("<=", value, high, pos)]
        return self.checked(_logic("AND", parts, pos))

    def in_list(self, left: _Expr, negated: bool, tok: _Token) -> _Expr:
        if left.kind != _PROP:
            raise self.error(
                f"IN needs a property on its left, not {left.describe()}{_not_hint(left)}", tok.pos
            )
        self.expect_op("(", "'(' after IN")
        values = [self.expect_string("IN (")]
        while self.peek().is_op(","):
            self.advance()
            values.append(self.expect_string("',' in the IN list"))
            if len(values) > MAX_IN_LIST_SIZE:
                raise self.error(f"IN list holds more than {MAX_IN_LIST_SIZE} values", tok.pos)
        self.expect_op(")", "',' or ')' in the IN list")
        return self.checked(_in(left, frozenset(values), negated, tok.pos))


# --------------------------------------------------------------------------------------
# Closure builders: each node's fn returns True, False or None (UNKNOWN), or raises _Abort
# --------------------------------------------------------------------------------------


def _boolean_cast(e: _Expr) -> _Expr:
    """UnaryExpression.createBooleanCast of a property: a string is never a Boolean."""
    get = e.fn

    def cast(p: _Props) -> bool | None:
        return None if get(p) is None else False

    return _Expr(_BOOLEAN, _BOOL, cast, e.pos, e.depth + 1)


def _not(e: _Expr, pos: int) -> _Expr:
    inner = e.fn

    def not_(p: _Props) -> bool | None:
        r = inner(p)
        return None if r is None else not r

    return _Expr(_BOOLEAN, _BOOL, not_, pos, e.depth + 1, logic="NOT")


def _negate(e: _Expr, pos: int) -> _Expr:
    """UnaryExpression.createNegate: numbers negate; anything else becomes null."""
    if e.kind == _CONST and e.jtype in _NUMERIC:
        value = -e.value
        return _Expr(_CONST, e.jtype, _constant_fn(value), pos, e.depth + 1, value=value)
    if e.kind in (_CONST, _PROP):  # nothing to evaluate
        return _Expr(_CONST, _NULL, _none_fn, pos, e.depth + 1)
    inner = e.fn

    def negate(p: _Props) -> None:  # still evaluated first: it may throw in Java
        inner(p)
        return None

    return _Expr(_OTHER, _NULL, negate, pos, e.depth + 1)


def _logic(word: str, operands: list[_Expr], pos: int) -> _Expr:
    """LogicExpression AND/OR, flattened: (a AND b) AND c evaluates exactly like a AND b AND c."""
    flat: list[_Expr] = []
    for e in operands:
        flat.extend(e.operands if e.logic == word else (e,))
    fns = tuple(e.fn for e in flat)
    depth = 1 + max(e.depth for e in flat)
    fn: _Fn
    if word == "AND":
        if len(fns) == 2:
            f1, f2 = fns

            def and2(p: _Props) -> bool | None:
                a = f1(p)
                if a is False:
                    return False
                b = f2(p)
                if b is False:
                    return False
                return a and b  # both True or None here: None if either is

            fn = and2
        else:

            def and_n(p: _Props) -> bool | None:
                unknown = False
                for f in fns:
                    r = f(p)
                    if r is False:
                        return False
                    if r is None:
                        unknown = True
                return None if unknown else True

            fn = and_n
    elif len(fns) == 2:
        f1, f2 = fns

        def or2(p: _Props) -> bool | None:
            a = f1(p)
            if a is True:
                return True
            b = f2(p)
            if b is True:
                return True
            return None if a is None or b is None else False

        fn = or2
    else:

        def or_n(p: _Props) -> bool | None:
            unknown = False
            for f in fns:
                r = f(p)
                if r is True:
                    return True
                if r is None:
                    unknown = True
            return None if unknown else False

        fn = or_n
    return _Expr(_BOOLEAN, _BOOL, fn, pos, depth, logic=word, operands=tuple(flat))


def _is_null(e: _Expr, negated: bool, pos: int) -> _Expr:
    get = e.fn
    fn: _Fn
    if negated:

        def is_not_null(p: _Props) -> bool:
            return get(p) is not None

        fn = is_not_null
    else:

        def is_null(p: _Props) -> bool:
            return get(p) is None

        fn = is_null
    return _Expr(_BOOLEAN, _BOOL, fn, pos, e.depth + 1)


def _relational(op: str, left: _Expr, right: _Expr, pos: int) -> _Expr:
    """ComparisonExpression > >= < <=: UNKNOWN on a null operand, else __compare."""
    pyop = _ORDER_OPS[op]
    depth = 1 + max(left.depth, right.depth)
    lt, rt = left.jtype, right.jtype
    fn: _Fn
    if left.kind == _PROP and right.kind == _CONST and rt in _NUMERIC:
        name, c = left.name, right.value
        if rt == _DOUBLE:

            def prop_op_double(p: _Props) -> bool | None:
                v = p.get(name)
                return None if v is None else pyop(_double_cmp(_java_double(v), c), 0)

            fn = prop_op_double
        else:
            lo, hi = _BOUNDS[rt]

            def prop_op_integer(p: _Props) -> bool | None:
                v = p.get(name)
                return None if v is None else pyop(_java_integer(v, lo, hi), c)

            fn = prop_op_integer
    else:
        lfn, rfn = left.fn, right.fn
        cmp = _strings_as_doubles if lt == rt == _STR else _comparator(lt, rt)

        def compare(p: _Props) -> bool | None:
            lv = lfn(p)
            if lv is None:
                return None
            rv = rfn(p)
            if rv is None:
                return None
            return pyop(cmp(lv, rv), 0)

        fn = compare
    return _Expr(_BOOLEAN, _BOOL, fn, pos, depth)


def _equal(left: _Expr, right: _Expr, pos: int) -> _Expr:
    """ComparisonExpression.doCreateEqual: null = null is TRUE, null = x UNKNOWN, x = null FALSE."""
    depth = 1 + max(left.depth, right.depth)
    lt, rt = left.jtype, right.jtype
    fn: _Fn
    if left.kind == _PROP and right.kind == _CONST and rt != _NULL:
        name, c = left.name, right.value
        if rt == _STR:

            def prop_eq_string(p: _Props) -> bool | None:
                v = p.get(name)
                return None if v is None else v == c

            fn = prop_eq_string
        else:
            cmp = _comparator(_STR, rt)

            def prop_eq_value(p: _Props) -> bool | None:
                v = p.get(name)
                return None if v is None else cmp(v, c) == 0

            fn = prop_eq_value
    else:
        lfn, rfn = left.fn, right.fn
        cmp = _comparator(lt, rt)  # not Python's ==, which would have TRUE = 1

        def equal(p: _Props) -> bool | None:
            lv = lfn(p)
            rv = rfn(p)
            if lv is None:
                return True if rv is None else None
            if rv is None:
                return False
            return cmp(lv, rv) == 0

        fn = equal
    return _Expr(_BOOLEAN, _BOOL, fn, pos, depth)


def _in(e: _Expr, values: frozenset[str], negated: bool, pos: int) -> _Expr:
    name = e.name
    fn: _Fn
    if negated:

        def not_in(p: _Props) -> bool | None:
            v = p.get(name)
            return None if v is None else v not in values

        fn = not_in
    else:

        def in_(p: _Props) -> bool | None:
            v = p.get(name)
            return None if v is None else v in values

        fn = in_
    return _Expr(_BOOLEAN, _BOOL, fn, pos, e.depth + 1)


def _string_test(word: str, negated: bool, e: _Expr, search: str, pos: int) -> _Expr:
    """CONTAINS/STARTSWITH/ENDSWITH: FALSE for an empty search, a null or a non-string."""
    depth = e.depth + 1
    test: Callable[[str], bool]
    if word == "CONTAINS":

        def test(v: str) -> bool:
            return search in v

    elif word == "STARTSWITH":
        test = operator.methodcaller("startswith", search)
    else:
        test = operator.methodcaller("endswith", search)
    fn: _Fn
    if not search:  # decided before the operand is evaluated, as in Java
        fn = _constant_fn(False)
    elif e.kind == _CONST:
        fn = _constant_fn(e.jtype == _STR and test(e.value) != negated)
    elif e.jtype == _STR:  # a property
        get = e.fn

        def string_test(p: _Props) -> bool:
            v = get(p)
            return v is not None and test(v) != negated

        fn = string_test
    else:  # a boolean or negated value: never a string, but evaluated all the same
        inner = e.fn

        def not_a_string(p: _Props) -> bool:
            inner(p)
            return False

        fn = not_a_string
    return _Expr(_BOOLEAN, _BOOL, fn, pos, depth)


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


class Filter:
    """A compiled SQL92 subscription filter. Immutable; equal and hashed by its source text."""

    __slots__ = ("_expression", "_fn", "_properties", "_matches_empty")

    def __init__(self, expression: str, fn: _Fn, properties: frozenset[str]) -> None:
        self._expression = expression
        self._fn = fn
        self._properties = properties
        self._matches_empty = self.matches({})

    @property
    def expression(self) -> str:
        """The source text, as given to ``compile_filter``."""
        return self._expression

    @property
    def properties_referenced(self) -> frozenset[str]:
        """Every property name the expression mentions; nothing else affects the result."""
        return self._properties

    @property
    def matches_empty(self) -> bool:
        """What ``matches`` answers for a message that has none of ``properties_referenced``."""
        return self._matches_empty

    def evaluate(self, properties: Mapping[str, str] | None) -> bool | None:
        """The three-valued result: True, False, or None (UNKNOWN, or an evaluation that fails).

        Property values must be ``str``, as the broker decodes them; any ``str`` is fine.
        """
        try:
            return self._fn({} if properties is None else properties)
        except _Abort:
            return None

    def matches(self, properties: Mapping[str, str] | None) -> bool:
        """True when the message with these properties is to be delivered: the result is TRUE."""
        try:
            return self._fn({} if properties is None else properties) is True
        except _Abort:  # RocketMQ's broker logs the exception and does not deliver
            return False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Filter):
            return NotImplemented
        return self._expression == other._expression

    def __hash__(self) -> int:
        return hash(self._expression)

    def __repr__(self) -> str:
        return f"Filter({self._expression!r})"


def compile_filter(expression: str) -> Filter:
    """Compile a SQL92 filter expression; raises ``SqlFilterError`` for any text that is not one.

    Results are cached by text (like RocketMQ's SelectorParser cache), so recompiling the
    same subscription, e.g. on every consumer heartbeat, costs a dictionary lookup.
    """
    if not isinstance(expression, str):
        raise SqlFilterError(f"the expression must be a str, not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise SqlFilterError(
            f"expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_LENGTH}",
            expression=expression[:100],
        )
    return _compile(expression)


@functools.lru_cache(maxsize=256)
def _compile(expression: str) -> Filter:
    parser = _Parser(expression)
    root = parser.parse()
    return Filter(expression, root.fn, frozenset(parser.names))
