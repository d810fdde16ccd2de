"""Cross-column bounds in a data spec: a number column's ``lower``/``upper`` given as a linear expression of other
number columns in its own units (``experience: {upper: age - 16}``, ``loan: {upper: 10 * income}``).

An expression is terms ``[number *] column`` (or ``column / number``) joined by ``+`` and ``-``, plus a number. It is
read against the table's columns (:func:`parse_rule`), kept as its canonical text (:func:`rule_text`) in the
codec, shown in words (:func:`rule_words`), evaluated per row in the rows' own units (:func:`rule_values`) and
handed to the searches as :class:`~datamodules.feature_types.RowBound` s, where ``Constraints.snap`` keeps every
counterfactual to it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from datamodules.suggest import did_you_mean

SIDES = ("lower", "upper")
NUMBER = r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
EXPRESSIONS = ("other number columns (continuous or integer) each times a number, joined by + and -, plus a number, "
               "such as upper: age - 16 or upper: 10 * income")
BOUND_VALUES = f"a number, or {EXPRESSIONS}"  # what a data spec's lower or upper may be
ALLOWED = f"allowed: {BOUND_VALUES}"
OPERATOR_BY_SPACE = re.compile(r"\s[-+*/−×]|[-+*/−×]\s")  # in a name: read bare, it would look like two names


def quoted_name(name) -> str:
    """A column's name as a rule writes and shows it: in backticks where it would read as something else bare (a
    name that is a number, `` `2023` ``; an operator beside a space, `` `net - gross` ``), else as it is."""
    text = str(name)
    needs = re.fullmatch(NUMBER, text) or OPERATOR_BY_SPACE.search(text)
    return f"`{text}`" if needs and "`" not in text else text


def _tokens(text: str, names: Sequence[str], where: str) -> list[tuple[str, object]]:
    """``text`` as ``(kind, value)`` tokens: ``column`` (a name in backticks, `` `2023` ``, or the longest column
    name that matches, not running on into a longer word; a bare number is a number), ``number``, ``op`` (``+ - *
    /``; ``−`` and ``×`` are read as ``-`` and ``*``) and ``word`` (a name that is no column). A one-line
    ``ValueError`` for any other character."""
    spelt = sorted((n for n in map(str, names) if not re.fullmatch(NUMBER, n)), key=len, reverse=True)
    by_text = {str(n): n for n in names}
    column = "|".join(re.escape(n) + (r"(?![\w.])" if re.search(r"\w$", n) else "") for n in spelt) or r"(?!)"
    pattern = re.compile(rf"\s*(?:`(?P<quoted>[^`]*)`|(?P<column>{column})|(?P<number>{NUMBER})|(?P<op>[-+*/−×])|"
                         rf"(?P<word>[^\W\d][\w.]*))")
    tokens, at = [], 0
    while at < len(text):
        found = pattern.match(text, at)
        if found is None or found.end() == at:
            rest = text[at:].strip()
            if not rest:
                break
            raise ValueError(f"{where}: {rest[0]!r} is not allowed (no parentheses, powers or functions); {ALLOWED}")
        kind = found.lastgroup
        value = found.group(kind)
        if kind == "quoted":  # a name in backticks is a column's, whatever it holds
            kind, value = ("column", by_text[value]) if value in by_text else ("word", value)
        elif kind == "column":
            value = by_text[value]
        tokens.append((kind, float(value) if kind == "number" else
                       {"−": "-", "×": "*"}.get(value, value) if kind == "op" else value))
        at = found.end()
    return tokens


def parse_rule(text, column: str, side: str, kinds: Mapping[str, str]) -> tuple[dict[str, float], float]:
    """``text`` (a data spec's ``lower`` or ``upper`` of ``column``) as ``({column: coefficient}, constant)``, read
    against ``kinds`` (``{feature column: kind}``); a one-line ``ValueError`` naming the column, the key and the value
    for an unknown column (with the one it is probably a misspelling of), a column that is no number (categorical,
    binary, ordinal), the column itself, and anything but a linear expression."""
    where = f"data_spec: column {column!r}: {side} {text!r}"
    tokens = _tokens(str(text), list(kinds), where)
    if not tokens:
        raise ValueError(f"{where}: empty; {ALLOWED}")
    terms: dict[str, float] = {}
    constant, at, sign = 0.0, 0, 1.0
    while True:
        if at < len(tokens) and tokens[at] in (("op", "+"), ("op", "-")):  # a sign before the first term
            sign *= -1.0 if tokens[at][1] == "-" else 1.0
            at += 1
        factor, name = sign, None
        while True:  # one term: factors joined by * and /
            if at < len(tokens) and tokens[at] == ("op", "*") and tokens[at - 1] == ("op", "*"):
                raise ValueError(f"{where}: '**' is not allowed (no powers); {ALLOWED}")
            if at >= len(tokens) or tokens[at][0] == "op":
                raise ValueError(f"{where}: incomplete (an operator without a column or number after it); {ALLOWED}")
            kind, value = tokens[at]
            if kind == "word":
                raise ValueError(f"{where}: unknown column {value!r}{did_you_mean(value, kinds)}; {ALLOWED}")
            if kind == "column":
                if value == column:
                    raise ValueError(f"{where}: refers to {column!r} itself; {ALLOWED}")
                if kinds[value] not in ("continuous", "integer"):
                    raise ValueError(f"{where}: {value!r} is a {kinds[value]} column, not a number; {ALLOWED}")
                if name is not None:
                    raise ValueError(f"{where}: not linear ({name!r} times {value!r}); {ALLOWED}")
                if at > 0 and tokens[at - 1] == ("op", "/"):
                    raise ValueError(f"{where}: not linear (a division by {value!r}); {ALLOWED}")
                name = value
            elif tokens[at - 1] == ("op", "/") if at > 0 else False:
                if value == 0:
                    raise ValueError(f"{where}: a division by 0; {ALLOWED}")
                factor /= value
            else:
                factor *= value
            at += 1
            if at < len(tokens) and tokens[at] in (("op", "*"), ("op", "/")):
                at += 1
                continue
            break
        if name is None:
            constant += factor
        else:
            terms[name] = terms.get(name, 0.0) + factor
        if at >= len(tokens):
            break
        if tokens[at][0] != "op":
            follows = _number(tokens[at][1]) if tokens[at][0] == "number" else repr(tokens[at][1])
            raise ValueError(f"{where}: {follows} follows without + - * or / before it; {ALLOWED}")
        sign = -1.0 if tokens[at][1] == "-" else 1.0
        at += 1
        if at >= len(tokens):
            raise ValueError(f"{where}: incomplete (it ends in an operator); {ALLOWED}")
    return {name: c for name, c in terms.items() if c != 0}, constant


def _number(value: float) -> str:
    return f"{value:.15g}"


def rule_text(terms: Mapping[str, float], constant: float) -> str:
    """The canonical text of a rule (``0.5 * a + b - 3``), which :func:`parse_rule` reads back to the same terms
    (:func:`pretty_rule` shows it as the start-up lines do)."""
    parts = []
    for name, coefficient in terms.items():
        size = abs(coefficient)
        body = quoted_name(name) if size == 1 else f"{_number(size)} * {quoted_name(name)}"
        parts.append((coefficient < 0, body))
    if constant or not parts:
        parts.append((constant < 0, _number(abs(constant))))
    text = ""
    for i, (negative, body) in enumerate(parts):
        text += (f"-{body}" if negative else body) if i == 0 else f" {'-' if negative else '+'} {body}"
    return text


def read_rules(pending: Sequence[tuple[object, Mapping[str, str]]]) -> None:
    """Set each fitted column's rules from its data spec's text (``[(column, {side: text})]``, every column of the
    table): the canonical text of its expression; a one-line ``ValueError`` for a rule :func:`parse_rule` refuses, a
    text that reads no column (``upper: '16'``) and rules that read one another in a circle."""
    kinds = {column.name: column.kind for column, _ in pending}
    for column, rules in pending:
        for side, text in rules.items():
            terms, constant = parse_rule(text, column.name, side, kinds)
            if not terms:  # a number in quotes, as before rules: perhaps a column name lost in the quotes
                raise ValueError(f"data_spec: column {column.name!r}: {side} {text!r} reads no column; allowed: a "
                                 f"number without quotes ({side}: {_number(constant)}), or {EXPRESSIONS}")
            setattr(column, f"{side}_rule", rule_text(terms, constant))
    check_cycles([column for column, _ in pending])


def column_rules(codec) -> list[tuple[object, str, dict[str, float], float]]:
    """``(column, side, terms, constant)`` of every rule of ``codec``'s columns, a column's rules after those of the
    columns its expressions read (so that one pass applies a chain such as ``tenure <= experience <=
    age - 16``)."""
    kinds = {c.name: c.kind for c in codec.columns}
    rules = [(c, side, *parse_rule(getattr(c, f"{side}_rule"), c.name, side, kinds))
             for c in codec.columns for side in SIDES if getattr(c, f"{side}_rule", None) is not None]
    ordered, pending = [], list(rules)
    while pending:  # a column's rules go once every ruled column they read has all of its rules placed
        waiting = {c.name for c, *_ in pending}
        ready = [r for r in pending if not waiting & (set(r[2]) - {r[0].name})] or pending  # a cycle: refused when
        ordered += ready  # the codec is fitted (check_cycles)
        pending = [r for r in pending if all(r is not done for done in ready)]
    return ordered


def check_cycles(columns) -> None:
    """A one-line ``ValueError`` where rules read one another in a circle (``a <= b`` and ``b <= a + 1``): no order
    of them settles both."""
    kinds = {c.name: c.kind for c in columns}
    reads = {}
    for c in columns:
        for side in SIDES:
            text = getattr(c, f"{side}_rule", None)
            if text is not None:
                reads.setdefault(c.name, set()).update(parse_rule(text, c.name, side, kinds)[0])

    def visit(name, path):
        for other in sorted(reads.get(name, ()), key=str):
            if other in path:
                circle = " -> ".join(map(str, [*path[path.index(other):], other]))
                raise ValueError(f"data_spec: column {other!r}: bounds that read one another in a circle "
                                 f"({circle}); allowed: bounds whose columns do not read one another in a circle")
            visit(other, [*path, other])

    for name in reads:
        visit(name, [name])


def rule_words(column) -> str:
    """A column's rules in words for the start-up lines (``, at least 0.5 × a, at most age − 16``; ``""``: none)."""
    words = ""
    for side, word in zip(SIDES, ("at least", "at most")):
        text = getattr(column, f"{side}_rule", None)
        if text is not None:
            words += f", {word} {pretty_rule(text)}"
    return words


def pretty_rule(text: str) -> str:
    """A rule's canonical text as the start-up lines and messages show it (``age − 16``, ``10 × income``); a name in
    backticks is shown as it is written (`` `net - gross` − 16``)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if i % 2 else re.sub(r"(?<=\s)-(?=\s)|^-", "−", re.sub(r"(?<=\s)\*(?=\s)", "×", part))
                   for i, part in enumerate(parts))


def rule_values(terms: Mapping[str, float], constant: float, frame: pd.DataFrame) -> np.ndarray:
    """A rule's bound per row of ``frame`` (its own units, float64; NaN where a column read holds no number)."""
    values = np.full(len(frame), float(constant))
    for name, coefficient in terms.items():
        values = values + coefficient * pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64)
    return values


def breaking_rows(codec, frame: pd.DataFrame) -> list[tuple[object, str, str, np.ndarray, np.ndarray]]:
    """Per rule of ``codec``: ``(column, side, the expression as shown (age − 16), rows breaking it (bool), the bound
    per row)`` for the rows of ``frame`` in original units (a row whose numbers are missing breaks nothing)."""
    found = []
    for column, side, terms, constant in column_rules(codec):
        bound = rule_values(terms, constant, frame)
        values = pd.to_numeric(frame[column.name], errors="coerce").to_numpy(np.float64)
        slack = 1e-9 * (np.abs(bound) + 1.0)  # the file's own decimals, not float rounding, break a rule
        broken = values > bound + slack if side == "upper" else values < bound - slack
        found.append((column, side, pretty_rule(rule_text(terms, constant)), broken, bound))
    return found


def rule_name(column, side: str, shown: str) -> str:
    """A rule as messages name it: ``experience <= age − 16``."""
    return f"{quoted_name(column.name)} {'<=' if side == 'upper' else '>='} {shown}"
