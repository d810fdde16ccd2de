"""How a user's CSV is written, read so that every value keeps its meaning.

Spreadsheets and databases export CSVs in local conventions, and pandas' defaults misread some of them without a
word: a ``;``-separated file becomes one column, ``127.600`` (127 600 with a thousands point) becomes 127.6,
``" Male"`` and ``"Male"`` become two categories. :func:`read_csv` reads every cell as text first and then decides:

- the delimiter from the header line: ``,``, ``;``, tab or ``|`` (or from Excel's first line ``sep=;``);
- the encoding: UTF-8 (a byte-order mark is dropped), else Windows-1252 (with a note);
- spaces around cells and column names are dropped, ``?`` and empty cells are missing values, rows and unnamed
  columns with no value at all (trailing ``;;;`` lines, a trailing delimiter) are left out;
- the words other tools write for a missing value (``NA``, ``NULL``, ``None``, ``nan``, ``#N/A``, ...) are missing
  values in a column of numbers, and stay values in a column of text, where ``NA`` may be North America (a note
  says which, either way); ``TRUE``/``FALSE`` stay as the file writes them (categories in the file's spelling);
- a column name written twice is a one-line error (pandas would rename the second ``income.1``);
- numbers: a file that is not comma-separated and holds decimal commas (``0,18``) reads ``.`` as the thousands
  separator (``12.000`` → 12000); a ``;``-separated file whose only dotted numbers look like thousands
  (``127.600``) is a one-line error, as the two readings differ a thousandfold;
- a first row that looks like data (Adult's ``adult.data``: its names recur as values below) is a one-line error;
- numbers dressed as text (``$36,428.20``, ``7.5%``, ``€ 1.234,50`` with decimal commas, ``1'234``, ``($1,200)`` in
  accounting's brackets: -1200) are numbers, with a note and their shared sign kept as the column's unit
  (:func:`unit_of`) for explanations; ``7.5%`` is 7.5, and a column writing ``0.075`` beside ``4%`` to ``14%`` stays
  text, refused by :func:`text_column_problems` (a share, or 0.075 %?). Their
  text is kept too, for an ordinal column whose ``order:`` lists such labels (:func:`labels_as_written`);
- the thousands separator each number column writes (``14 999,01 €``: a space; ``1'234``; none: ``24062,39``), in a
  file whose numbers show a locale (:func:`file_thousands`), so that messages write numbers as the file does
  (:func:`as_written`).

:func:`text_column_problems` then finds, unless the data spec declares the column's kind, text whose number is
ambiguous (``30,6`` in a comma-separated file: 30.6 or 306?; ``7.5%`` beside ``0.075``), dates, and text of more than 100 different values: read
as categories they would silently train as hundreds of unrelated levels. Such a column must be cleaned, or left out
with ``--drop-columns``; the data module reports every such problem of a file at once.

:func:`read_table` reads a table file (a CSV as above, Parquet, or an Excel workbook's sheet, whose cells
:mod:`datamodules.workbook` writes as a CSV's and which is then read as above) for training and the rows to explain
alike.
"""

from __future__ import annotations

import csv
import hashlib
import re
import shlex
from collections import Counter
from pathlib import Path

import pandas as pd

from datamodules.table_header import SEP_LINE, column_name, sniff_delimiter, target_column_error
from datamodules.table_header import header_line as _header_line
from datamodules.table_header import second_line as _second_line
from datamodules.workbook import OLD_EXCEL_FIX, WORKBOOK_SUFFIXES, is_old_excel, split_sheet, table_file, workbook_cells

MISSING_MARKS = ("?",)  # as in the UCI files (Adult): a cell that is only '?' is a missing value
# pandas' words for a missing value (its read_csv default na_values, less the empty cell)
MISSING_WORDS = ("#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",
                 "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
DECIMAL_COMMA = re.compile(r"[+-]?(?:[1-9]\d{0,2}(?:\.\d{3})+|\d+)(?:,\d+)?")  # 0,18  12.000  1.234,5
THOUSANDS_POINT = re.compile(r"[+-]?[1-9]\d{0,2}(?:\.\d{3})+")  # 127.600: thousands, or three decimals?
NUMBER_DRESS = re.compile(r"[$€£¥%\s\u00a0',()]")  # what turns a number into text: currency, percent, separators
DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}"
                  r"|\d{4}/\d{1,2}/\d{1,2}")


class TableError(ValueError):
    """A table file refused in one line, as fields: ``option`` (the file's option as the caller names it: ``data``
    for a training, ``--rows`` for rows to explain), ``value`` (the file), ``problem`` (what is wrong, naming the
    file) and ``allowed``. The message reads ``OPTION: PROBLEM; allowed: ALLOWED`` (a problem asked as a question
    ends with its question mark instead of ``;``)."""

    def __init__(self, option: str, value, problem: str, allowed: str):
        self.option, self.value, self.problem, self.allowed = option, value, problem, allowed
        super().__init__(f"{option}: {problem}{'' if problem.endswith('?') else ';'} allowed: {allowed}")


def _is_text(values: pd.Series) -> bool:
    """Whether a column holds text (object dtype, or pandas' ``str``/``string`` dtypes)."""
    return pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)


def _tidy_text(column: pd.Series) -> pd.Series:
    """Text cells without surrounding spaces; empty cells and ``?`` as missing values. Other values stay."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype(object)
    if not _is_text(column):
        return column
    if pd.api.types.infer_dtype(column, skipna=True) == "string":  # text only: pandas strips it at C speed
        text = column.str.strip()
    else:
        text = column.astype(object).map(lambda v: v.strip() if isinstance(v, str) else v)
    return text.where(~text.isin(("",) + MISSING_MARKS), None)


def _as_numbers(text: pd.Series, decimal_comma: bool) -> pd.Series | None:
    """The column as numbers when every value is one (in the file's convention), else ``None``."""
    present = text.dropna()
    if not len(present):
        return None
    if decimal_comma and present.str.fullmatch(DECIMAL_COMMA.pattern).all():
        return pd.to_numeric(text.str.replace(".", "", regex=False).str.replace(",", ".", regex=False))
    if pd.isna(pd.to_numeric(present.iloc[:1], errors="coerce").iloc[0]):
        return None  # a column of words: its first value says so without parsing every cell
    numbers = pd.to_numeric(text, errors="coerce")
    return numbers if numbers[text.notna()].notna().all() else None


CURRENCY = re.compile(r"^([+-]?)\s*[$€£¥]?\s*([+-]?)\s*(.*?)\s*[$€£¥]?$")  # $1,234.50  -€12  12 €
THOUSANDS_COMMA = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")  # 36,428.20 (or no separator)
THOUSANDS_APOSTROPHE = re.compile(r"\d{1,3}(?:'\d{3})+(?:\.\d+)?")  # 1'234.50 (Switzerland)


COMMA_POINT = str.maketrans(",.", ".,")  # 60,800.5 → 60.800,5
THOUSANDS = (",", ".", " ", "'", "")  # the thousands separators a column may write its numbers with ("": none)
PYTHON_NUMBER = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")  # 60,800.5  5400  0.31, as Python writes


def _grouped(digits: str, separator: str) -> str:
    """A whole number's digits with ``separator`` between each three from the right: ``24062`` → ``24 062``."""
    head = len(digits) % 3 or 3
    return digits[:head] + "".join(separator + digits[i:i + 3] for i in range(head, len(digits), 3))


def as_written(text: str, decimal_comma: bool, thousands: str | None = None) -> str:
    """A number's text as Python writes it (``60,800.5``, ``0.31``, ``5400``) as the file writes numbers: with
    ``thousands``, the separator the file writes that column's thousands with (:data:`THOUSANDS`:
    :func:`thousands_written`), its whole part grouped so (``60 800,5`` and ``5 400`` for a French file,
    ``1'234.5`` for a Swiss one, ``60800,5`` for one that groups none) and its decimal comma or point as the file's;
    without it (a file of plain numbers, a model trained before the separator was kept), with ``decimal_comma``
    (a file with decimal commas, ``60.800,00 €``) its points and commas swapped (``60.800,5``, ``0,31``), else as
    it is. Every number a message shows from a file (start-up notes, fill-in notes, refusals, explanations) goes
    through here."""
    if thousands is None:
        return text.translate(COMMA_POINT) if decimal_comma else text
    point = "," if decimal_comma else "."

    def written(match: re.Match) -> str:
        whole = _grouped(match.group(1).replace(",", ""), thousands)
        return whole + (point + match.group(2)[1:] if match.group(2) else "")

    return PYTHON_NUMBER.sub(written, text)


THOUSANDS_SAMPLE = 1000  # distinct texts of numbers of 1000 and more that say a column's separator (a file is consistent)
SPACES = re.compile(r"[\s\u00a0\u202f]+")  # a no-break space (U+00A0) or a narrow one (U+202F) between thousands


def thousands_written(texts: pd.Series, numbers: pd.Series, decimal_comma: bool) -> str | None:
    """The thousands separator a column's ``texts`` (its cells as the file writes them, plain or dressed:
    ``14 999,01 €``, ``$36,428.20``, ``1'234``, ``24062,39``; ``numbers``: the same cells as read) write numbers of
    1000 and more with, the one most of the first :data:`THOUSANDS_SAMPLE` such distinct texts use
    (:data:`THOUSANDS`; a space, also a no-break one, as a plain space: it shows the same and stays one character in
    any terminal or code page); ``""`` where they group none; ``None`` where no number reaches 1000 (nothing
    shows) or the column is no text."""
    if not _is_text(texts):
        return None
    large = pd.to_numeric(numbers, errors="coerce").abs() >= 1000
    distinct = pd.Series(texts[large.to_numpy()].dropna().unique()[:THOUSANDS_SAMPLE], dtype=object)
    if not len(distinct) or not all(isinstance(v, str) for v in distinct):
        return None
    body = distinct.str.replace(r"[$€£¥%()+-]", "", regex=True)
    whole = body.str.split("," if decimal_comma else ".", n=1).str[0].str.strip()
    marks = whole.str.replace(r"\d", "", regex=True).str.replace(SPACES.pattern, " ", regex=True).str[:1]
    marks = marks[marks.isin(THOUSANDS)]
    return Counter(marks.tolist()).most_common(1)[0][0] if len(marks) else None  # a tie: the first written


def undressed_number(value, decimal_comma: bool):
    """The number a cell such as ``$36,428.20``, ``7.5%``, ``€ 1.234,50`` or ``1'234`` writes, without its currency
    sign, percent sign and thousands separators (``7.5%`` is 7.5), and negative where accounting writes it in
    brackets (``($1,200)`` is -1200); ``None`` for other text, such as ``1,5`` in a
    file without decimal commas (one and a half, or fifteen?). Numbers and missing values come back as they are."""
    if not isinstance(value, str):
        return value
    text = value.replace("\u00a0", " ").strip()
    if len(text) > 2 and text[0] == "(" and text[-1] == ")" and text[1] not in "+-()":  # accounting: ($1,200) is -1200
        number = undressed_number(text[1:-1], decimal_comma)
        return None if number is None else -number
    percent = text.endswith("%")
    match = CURRENCY.fullmatch(text[:-1].rstrip() if percent else text)
    if match is None or (match.group(1) and match.group(2)):
        return None
    sign, body = match.group(1) or match.group(2), match.group(3).replace(" ", "")
    if decimal_comma and DECIMAL_COMMA.fullmatch(body):
        body = body.replace(".", "").replace(",", ".")
    elif not decimal_comma and (THOUSANDS_COMMA.fullmatch(body) or THOUSANDS_APOSTROPHE.fullmatch(body)):
        body = body.replace(",", "").replace("'", "")
    else:
        return None
    number = float(sign + body)
    return int(number) if number.is_integer() and "." not in body else number


def _undressed_or_as_written(value, decimal_comma: bool):
    """:func:`undressed_number` of ``value`` where it reads one, else ``value`` as it is (refused later)."""
    number = undressed_number(value, decimal_comma)
    return value if number is None else number


def unit_of(values) -> str | None:
    """The unit every value of a column of dressed numbers shares, as a format for a number: ``"${}"`` for
    ``$36,428.20``, ``"{}%"`` for ``7.5%``, ``"{} %"`` for a French ``49,1 %`` (every percent of the column written
    with the space), ``"{} €"`` for ``12 €``; ``None`` where they share none."""
    units = set()
    for value in values:
        text = value.replace("\u00a0", " ").strip().removeprefix("(").removesuffix(")").lstrip("+-").strip()
        if text.endswith("%"):
            units.add("{} %" if text[-2:-1] == " " else "{}%")
        elif text[:1] in "$€£¥" and text[:1]:
            units.add(text[0] + "{}")
        elif text[-1:] in "$€£¥" and text[-1:]:
            units.add("{}" + (" " if text[-2:-1] == " " else "") + text[-1])
        else:
            units.add(None)
    if units == {"{}%", "{} %"}:  # written both ways: the plain sign
        units = {"{}%"}
    return units.pop() if len(units) == 1 else None


LABELS_KEPT = 100  # distinct texts of a dressed column kept for labels_as_written (an order's most: MAX_CATEGORIES)


class WrittenLabels(dict):
    """``{column: {text as written: its number}}`` of the dressed columns (:func:`labels_as_written`), kept in a
    frame's ``attrs``. pandas deep-copies ``attrs`` with every operation on the frame; this mapping is never changed
    once made (a new one replaces it), so a copy is the mapping itself, not one Python call per label."""

    def __deepcopy__(self, memo) -> WrittenLabels:
        return self


def _dressed_numbers(text: pd.Series, decimal_comma: bool, notes: list[str], units: dict,
                     written: dict) -> pd.Series | None:
    """A text column in which every value is a number dressed as text (``$36,428.20``, ``7.5%``) as numbers, with a
    note in ``notes`` showing how its first value was read, its shared unit (:func:`unit_of`) in ``units`` and its
    distinct texts with their numbers (``{"10%": 10}``) in ``written`` (:func:`labels_as_written` gives them back);
    ``None`` where some value is no such number."""
    values = _distinct_text(text)
    if values is None:
        return None
    numbers = {}
    for value in values:  # each distinct value once; a column of words stops at its first
        number = undressed_number(value, decimal_comma)
        if number is None:
            return None
        numbers[value] = number
    if _mixed_percent(values, decimal_comma) is not None:  # 7.5% beside 0.075: refused by text_column_problems
        return None
    first = values[0]
    percent = " ('%' dropped: 7.5% is 7.5)" if any(v.endswith("%") for v in values) and \
        not first.endswith("%") else ""
    shown = first.replace("\u00a0", " ").replace("\u202f", " ")  # a no-break space as the space it shows, not \xa0
    notes.append(f"{text.name}: numbers written as text read as numbers ({shown!r} is "
                 f"{numbers[first]!r}){percent}; rows for explain.py may write them either way, a served model takes them as "
                 f"numbers")
    unit = unit_of(values)
    if unit:
        units[text.name] = unit
    if len(numbers) <= LABELS_KEPT:  # a possible order's labels; attrs are copied with the frame, so kept small
        written[text.name] = numbers
    return pd.to_numeric(text.astype(object).map(numbers))  # the missing cells stay missing


def labels_as_written(frame: pd.DataFrame, names, option: str = "data") -> pd.DataFrame:
    """``frame`` with the columns ``names`` that the reader turned from dressed text into numbers (``10%``, ``$1,000``)
    given back their text as the file wrote it, without their note and unit: an ordinal column whose ``order:``
    lists such labels matches them as written (``[10%, 20%, 50%]``), not as the numbers 10, 20, 50. A
    :class:`TableError` naming ``option`` where two texts of a column wrote one number (``10%`` and ``10.0%``): the
    numbers cannot say which label a row held."""
    written = dict(frame.attrs.get("written", {}))
    names = [name for name in names if name in written and name in frame.columns]
    if not names:
        return frame
    frame, notes, units = frame.copy(), list(frame.attrs.get("notes", ())), dict(frame.attrs.get("units", {}))
    thousands = dict(frame.attrs.get("thousands", {}))
    for name in names:
        texts = written.pop(name)
        by_number: dict = {}
        for label, number in texts.items():
            if number in by_number:
                raise TableError(option, name, f"column {name!r} writes {by_number[number]!r} and {label!r}, one "
                                 "number as two labels of its order", "each label written one way in the file")
            by_number[number] = label
        frame[name] = frame[name].astype(object).map(by_number)  # the missing cells stay missing
        notes = [note for note in notes if not note.startswith(f"{name}: numbers written as text read as numbers")]
        units.pop(name, None)
        thousands.pop(name, None)
    frame.attrs.update(notes=notes, units=units, written=WrittenLabels(written), thousands=thousands)
    return frame


def _distinct_text(values: pd.Series) -> list[str] | None:
    """The distinct values of a column's present cells, in the order they first appear, when every one is text;
    else ``None``. Checks and conversions run on these: a column of 200 000 rows may hold 50 values."""
    present = list(values.dropna().unique())
    if not present or not all(isinstance(v, str) for v in present):
        return None
    return present


def _uses_decimal_comma(frame: pd.DataFrame) -> bool:
    """Whether a column holds numbers with a decimal comma (``0,18``) in every row, also where each is dressed with a
    currency or percent sign and spaces as thousands separators (a French export's ``14 999,01 €`` and ``49,1 %``:
    a file with no plain number that shows its decimal comma)."""
    for column in frame.columns:
        present = frame[column].dropna()
        if not len(present) or not present.str.contains(",", regex=False).any():
            continue
        bare = present.str.replace(r"[\s\u00a0\u202f$€£¥]", "", regex=True).str.removesuffix("%")
        # dressed: a comma that could be a thousands separator ($1,234 in every cell) shows no decimal comma
        shown = bare.str.fullmatch(r"[+-]?[\d.]+,(?:\d{1,2}|\d{4,})").any() if not present.equals(bare) else True
        if bare.str.fullmatch(DECIMAL_COMMA.pattern).all() and shown:
            return True
    return False


def _echoes(values: pd.Series, name: str) -> bool:
    """Whether a column holds its own name as a value (as text, or as the number the name reads as)."""
    if not name:
        return False
    if _is_text(values):
        return bool((values == name).any())
    number = pd.to_numeric(pd.Series([name]), errors="coerce").iloc[0]
    return not pd.isna(number) and bool((values == number).any())


def _check_header(frame: pd.DataFrame, path: Path, option: str) -> None:
    """A :class:`TableError` for a file without a header row: most column names recur as values of their column."""
    echoed = [name for name in frame.columns if _echoes(frame[name], str(name).strip())]
    if len(frame.columns) > 1 and len(echoed) >= max(2, len(frame.columns) // 2):
        shown = ", ".join(repr(str(n)) for n in echoed[:3])
        raise TableError(option, str(path), f"the first row of {path} looks like data, not column names ({shown}, ... "
                         "recur as values in their own columns)", "a file whose first row names the columns: add one")


def _check_thousands(text: pd.Series, name: str, path: Path, sep: str, option: str) -> None:
    """A :class:`TableError` for a column of a ``;``-separated file whose dotted numbers all look like thousands."""
    present = text.dropna()
    if not _is_text(present):
        return
    dotted = present[present.str.contains(".", regex=False)]
    if len(dotted) and dotted.str.fullmatch(THOUSANDS_POINT.pattern).all():
        raise TableError(option, str(path), f"column {name!r} of {path} holds numbers such as {dotted.iloc[0]!r} in a "
                         f"{sep!r}-separated file: is '.' a thousands separator or a decimal point?",
                         "numbers without thousands separators (127600), or with a decimal comma (127,6)")


def _check_names_once(header: str, sep: str, path: Path, option: str) -> None:
    """A :class:`TableError` for a column name the header line holds twice."""
    _check_names(next(csv.reader([header], delimiter=sep)), path, option)


def _check_names(names: list, path: Path, option: str) -> None:
    """A :class:`TableError` for a column name a header (a CSV's line, a workbook's first row) holds twice."""
    names = [name.strip() for name in names]
    twice = next((name for i, name in enumerate(names) if name and name in names[:i]), None)
    if twice is not None:
        raise TableError(option, str(path), f"{path.name} names the column {twice!r} twice",
                         "a header row with each column's name once (rename or remove one of them)")


def _missing_words(text: pd.Series, name: str, decimal_comma: bool) -> tuple[pd.Series, str | None]:
    """A text column whose cells include words for a missing value (``NA``, ``NULL``, ...): in a column of numbers
    they become missing values, in a column of text they stay values; with a note saying which."""
    words = text.isin(MISSING_WORDS)
    if not words.any():
        return text, None
    found = ", ".join(repr(w) for w in pd.unique(text[words]))
    count = int(words.sum())
    rest = text.where(~words)
    if _as_numbers(rest, decimal_comma) is not None or _all_dressed(rest, decimal_comma):
        return rest, f"{name}: {found} read as a missing value in {count} row(s)"
    return text, (f"{name}: {found} kept as a category in {count} row(s) (the column holds text); where it means a "
                  "missing value, leave the cell empty or write '?'")


def _all_dressed(text: pd.Series, decimal_comma: bool) -> bool:
    """Whether every present cell of a text column is a number dressed as text (``$36,428.20``, ``7.5%``)."""
    values = _distinct_text(text)
    return values is not None and all(undressed_number(v, decimal_comma) is not None for v in values)


def read_csv(path, option: str = "data") -> pd.DataFrame:
    """A CSV file as a DataFrame read as the module docstring says; ``attrs["notes"]``: what was decided (encoding,
    delimiter, number format) for the start-up message, ``attrs["decimal_comma"]``: whether numbers were read with
    decimal commas, ``attrs["thousands"]``: each number column's thousands separator (:func:`file_thousands`). A
    :class:`TableError` naming ``option`` for a file read wrongly otherwise."""
    path, notes = Path(path), []
    encoding = "utf-8-sig"
    try:
        header = _header_line(path, encoding)
    except UnicodeDecodeError:
        encoding = "cp1252"
        header = _header_line(path, encoding)
        notes.append(f"{path.name} is not UTF-8: read as Windows-1252")
    hint = SEP_LINE.fullmatch(header.strip())  # Excel's first line 'sep=;' names the delimiter
    sep = hint.group(1) if hint else sniff_delimiter(header)
    if sep != ",":
        notes.append(f"{path.name}: columns separated by {sep!r}")
    _check_names_once(header if not hint else _second_line(path, encoding), sep, path, option)
    # Every cell as written: numbers, decimal commas and thousands points are decided below, TRUE/FALSE stay text,
    # and only empty cells are missing here (pandas' own missing words are decided per column).
    options = {"sep": sep, "skiprows": 1 if hint else None, "dtype": str, "keep_default_na": False,
               "na_values": [""]}
    try:
        cells = pd.read_csv(path, encoding=encoding, **options)
    except UnicodeDecodeError:  # a non-UTF-8 byte past the header line
        encoding = "cp1252"
        notes.append(f"{path.name} is not UTF-8: read as Windows-1252")
        cells = pd.read_csv(path, encoding=encoding, **options)
    return _typed_cells(cells, path, option, notes, decimal_commas=sep != ",", semicolons=sep == ";")


def _typed_cells(cells: pd.DataFrame, path: Path, option: str, notes: list[str], decimal_commas: bool = False,
                 semicolons: bool = False, decided: bool | None = None) -> pd.DataFrame:
    """:func:`read_csv`'s reading of a table's cells as written (text, ``None`` for an empty cell), a CSV's or a
    workbook's (:func:`~datamodules.workbook.workbook_cells`): names and cells tidied, rows and unnamed columns with
    no value left out, then per column missing words, numbers and dressed numbers. ``decimal_commas``: look for
    them (a file whose columns the comma does not separate); ``semicolons``: a ``;``-separated file, whose dotted
    numbers may be thousands; ``decided``: whether the numbers are written with decimal commas, where the file says
    so itself (a workbook's number formats), instead of looking."""
    cells.columns = [column_name(c) for c in cells.columns]
    cells = cells.apply(_tidy_text).dropna(how="all").reset_index(drop=True)
    cells = cells.drop(columns=[c for c in cells.columns if c.startswith("Unnamed: ") and cells[c].isna().all()])
    _check_header(cells, path, option)
    decimal_comma = decided if decided is not None else decimal_commas and _uses_decimal_comma(cells)
    comma_note = len(notes) if decimal_comma else None  # said once the columns' thousands separators are known
    frame, units, written, separators, dressed = pd.DataFrame(index=cells.index), {}, {}, {}, False
    for name in cells.columns:
        cells[name], note = _missing_words(cells[name], name, decimal_comma)
        if note:
            notes.append(note)
        numbers = _as_numbers(cells[name], decimal_comma) if _is_text(cells[name]) else cells[name]
        if numbers is not None and semicolons and not decimal_comma:
            _check_thousands(cells[name], name, path, ";", option)
        if numbers is None and not (semicolons and not decimal_comma):  # ';' without decimal commas: '.' unclear
            numbers = _dressed_numbers(cells[name], decimal_comma, notes, units, written)
            dressed = dressed or numbers is not None
        if numbers is not None and _is_text(cells[name]):
            separators[name] = (cells[name], numbers)
        frame[name] = cells[name] if numbers is None else numbers
    styled = decimal_comma or dressed  # else a file of plain numbers: no separator to find (file_thousands)
    separators = {name: thousands_written(*read, decimal_comma) for name, read in separators.items()} if styled else {}
    thousands = file_thousands(separators, styled)
    if comma_note is not None:
        notes.insert(comma_note, _decimal_comma_note(path.name, thousands))
    frame.attrs.update(decimal_comma=decimal_comma, notes=notes, units=units, written=WrittenLabels(written),
                       thousands=thousands)
    return frame


def _decimal_comma_note(name: str, thousands: dict[str, str]) -> str:
    """The start-up note on a file with decimal commas: how it groups thousands, as most of its columns write them
    (``thousands``, :func:`file_thousands`); a dotted ``12.000`` is read as 12000 either way."""
    if most_grouped(thousands.values()) == " ":
        return f"{name}: decimal commas (0,5) and spaces as the thousands separator (14 999,01; 12.000 also reads as 12000)"
    return f"{name}: decimal commas (0,5) and '.' as the thousands separator (12.000 = 12000)"


def most_grouped(separators) -> str | None:
    """The thousands separator most of ``separators`` are (the first written on a tie), those that group none
    (``""``, ``None``) left out; ``None`` where none groups."""
    grouping = Counter(sep for sep in separators if sep).most_common(1)
    return grouping[0][0] if grouping else None


def file_thousands(separators: dict, styled: bool) -> dict[str, str]:
    """``{column: the thousands separator its numbers are written with}`` (:func:`as_written`) of a file whose number
    columns write ``separators`` (:func:`thousands_written`), for a ``styled`` file only: one whose numbers show a
    locale (decimal commas, or numbers dressed as text, ``14 999,01 €``, ``$36,428.20``). A column without a number
    of 1000 or more takes the separator most of the file's other columns write (``""`` where they group none);
    none where no column shows one. A file of plain numbers (``30600``, ``0.25``, as databases and pandas write
    them, a workbook's numbers) shows no style: its numbers keep :func:`as_written`'s grouping by ``,``."""
    if not styled:
        return {}
    shown = [sep for sep in separators.values() if sep is not None]
    fallback = most_grouped(shown) or ("" if shown else None)
    found = {name: fallback if sep is None else sep for name, sep in separators.items()}
    return {name: sep for name, sep in found.items() if sep is not None}


def read_workbook(value, option: str = "data") -> pd.DataFrame:
    """An Excel workbook's sheet (``loans.xlsx``, ``loans.xlsx#Applications``) as :func:`read_csv` reads the same
    table saved as CSV: its cells as a CSV holds them (:func:`~datamodules.workbook.workbook_cells`), then read as
    a comma-separated file's (no decimal commas: a workbook stores numbers as numbers), or, where its number formats
    show amounts as much of Europe writes them (``#,##0.00 "€"``), as such an Excel's CSV, with decimal commas."""
    cells, notes, comma = workbook_cells(value, option)
    _check_names(list(cells.columns), Path(str(value)), option)
    return _typed_cells(cells, Path(str(value)), option, notes, decided=comma)


TABLE_ALLOWED = "a table with a header row and data rows"


def read_table(path, option: str = "data") -> pd.DataFrame:
    """The file as a DataFrame (a CSV read by :func:`read_csv`: its delimiter, decimal commas, spaces around cells;
    a workbook's sheet, ``loans.xlsx#Applications``, by :func:`read_workbook`; ``attrs["notes"]`` says what was
    decided; an ``.xls`` file is refused). A missing file is a ``FileNotFoundError``; an unreadable, empty or
    ambiguous one a :class:`TableError` naming ``option``, the caller's name for the file (``data``, ``--rows``)."""
    path, sheet = split_sheet(path)
    path = Path(path)
    if is_old_excel(path):  # before its existence: the file is refused either way
        raise TableError(option, str(path), f"{path.name} is an old binary Excel workbook (.xls), which needs "
                         "another reader", OLD_EXCEL_FIX)
    if not path.is_file():
        raise FileNotFoundError(f"{option}: file {str(path)!r} not found")
    key = content_key(path if sheet is None else f"{path}#{sheet}")
    if key not in _LAST_READ:
        _LAST_READ[key] = _read_table_file(path if sheet is None else Path(f"{path}#{sheet}"), option)
        while len(_LAST_READ) > KEPT_TABLES:
            _LAST_READ.pop(next(iter(_LAST_READ)))  # the least recently read
    _LAST_READ[key] = _LAST_READ.pop(key)  # now the most recently read
    return _LAST_READ[key].copy(deep=False)  # copy-on-write: a caller's changes never reach the kept frame


def content_key(path) -> tuple[str, str | None, str]:
    """A table file by its place and content: ``(absolute path, sheet, digest)``; a file rewritten within the
    clock's tick keeps its mtime, so its bytes are hashed (a millisecond per megabyte)."""
    path, sheet = split_sheet(path)
    with open(path, "rb") as handle:
        return str(Path(path).resolve()), sheet, hashlib.file_digest(handle, "blake2b").hexdigest()


# The last table files read, by path and content: a training reads its file once, although choosing
# its CT settings and building its data module both read it (a 200 000-row CSV takes seconds), and a compare of
# several tables reads each once, although it checks them all before it builds their data modules. A few, not all:
# a command reads its data files, then perhaps rows to explain.
KEPT_TABLES = 4
_LAST_READ: dict[tuple, pd.DataFrame] = {}


def _read_table_file(path: Path, option: str) -> pd.DataFrame:
    """:func:`read_table`'s reading of ``path``, without the reuse of the last file read."""
    try:
        if table_file(path).lower().endswith(WORKBOOK_SUFFIXES):  # loans.xlsx, loans.xlsx#Applications
            frame = read_workbook(path, option)
        elif path.suffix.lower() in (".parquet", ".pq"):
            frame = tidy_frame(pd.read_parquet(path))
        else:
            frame = read_csv(path, option)
    except TableError:  # read_csv's own one-line errors
        raise
    except pd.errors.EmptyDataError:
        raise TableError(option, str(path), f"{path} is empty", TABLE_ALLOWED) from None
    except Exception as error:  # noqa: BLE001 - pandas and pyarrow raise many types for a malformed file
        raise TableError(option, str(path), f"cannot read {path} ({type(error).__name__}: "
                         f"{(str(error).splitlines() or [''])[0]})", TABLE_ALLOWED) from None
    if frame.empty or frame.shape[1] == 0:
        raise TableError(option, str(path), f"{path} has no data rows", TABLE_ALLOWED)
    return frame


def tidy_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A Parquet file's or DataFrame's text columns as :func:`read_csv` leaves a CSV's: cells without surrounding
    spaces, empty cells and ``?`` missing, numbers dressed as text (``$36,428.20``) as numbers, with a note."""
    frame, notes = frame.apply(_tidy_text), list(frame.attrs.get("notes", ()))
    frame.columns = [column_name(c) if isinstance(c, str) else c for c in frame.columns]
    units, written, separators = dict(frame.attrs.get("units", {})), dict(frame.attrs.get("written", {})), {}
    for name in frame.columns:
        numbers = _dressed_numbers(frame[name], False, notes, units, written) if _is_text(frame[name]) else None
        if numbers is not None:
            separators[name] = thousands_written(frame[name], numbers, False)
            frame[name] = numbers
    thousands = {**frame.attrs.get("thousands", {}), **file_thousands(separators, bool(separators))}
    frame.attrs.update(notes=notes, units=units, written=WrittenLabels(written), thousands=thousands)
    return frame


def _mixed_percent(values: list[str], decimal_comma: bool | None = None) -> tuple[str, str] | None:
    """A value written with ``%`` and one without (``'7.5%'``, ``'0.075'``) where a column's numbers are written both
    ways and a number without ``%`` lies outside the range of those with it, else ``None``: ``0.075`` beside 4 % to
    14 % may be 7.5 % as a share or 0.075 %, a hundredfold apart, and only the file's author knows (``7.5`` there is
    read as 7.5 %). ``decimal_comma``: the file's number format, ``None`` where unknown (either reading)."""
    def number(text: str):
        readings = (decimal_comma,) if decimal_comma is not None else (False, True)
        return next((n for n in (undressed_number(text, d) for d in readings) if n is not None), None)

    percent = {v: number(v) for v in values if v.rstrip().endswith("%")}
    bare = {v: number(v) for v in values if not v.rstrip().endswith("%")}
    if not percent or not bare or None in percent.values() or None in bare.values():
        return None
    low, high = min(percent.values()), max(percent.values())
    outside = next((v for v, n in bare.items() if not low <= n <= high), None)
    return None if outside is None else (next(iter(percent)), outside)


def _number_text(values: pd.Series) -> str | None:
    """A value of a text column in which every value is a number dressed as text (``$12,000``, ``35%``), else
    ``None``."""
    distinct = _distinct_text(values) if _is_text(values) else None
    if distinct is None or not _bare_numbers(distinct[:1]) or not _bare_numbers(distinct):  # words: the first says so
        return None
    return distinct[0]


def _bare_numbers(texts: list[str]) -> bool:
    """Whether every text is a number once its currency and percent signs, spaces and separators are dropped."""
    bare = pd.Series([NUMBER_DRESS.sub("", v) for v in texts])
    return not (bare == "").any() and not pd.to_numeric(bare, errors="coerce").isna().any()


STRAY_SHARE = 0.05  # a column of numbers with at most this share of other cells: a typo, not a column of text


def _stray_text(values: pd.Series) -> list | None:
    """The distinct cells of a text column that are no number, where all other cells are numbers (plain or dressed,
    ``$85,000``) and they are at most :data:`STRAY_SHARE` of the cells (``'forty'`` among ages, ``'85k'`` among
    salaries): as categories, the column would train as unrelated levels. ``None`` for other columns."""
    present = values.dropna()
    distinct = _distinct_text(values) if _is_text(values) and len(present) >= 2 else None
    if distinct is None:
        return None
    strays = [v for v in distinct if undressed_number(v, False) is None and undressed_number(v, True) is None]
    if not strays or present.isin(strays).sum() > STRAY_SHARE * len(present):  # each distinct value judged once
        return None
    return strays


def _date_text(values: pd.Series):
    """A value of a column of dates (a datetime dtype, or text that is a date in every row), else ``None``."""
    present = values.dropna()
    if not len(present):
        return None
    if pd.api.types.is_datetime64_any_dtype(values):  # a Parquet or Excel date: 2021-01-01, not 2021-01-01 00:00:00
        first = present.iloc[0]
        return str(first.date()) if first == first.normalize() else str(first)
    distinct = _distinct_text(values) if _is_text(values) else None
    if distinct is not None and all(DATE.fullmatch(v) for v in distinct):
        return distinct[0]
    return None


def text_column_problems(frame: pd.DataFrame, target: str, declared: dict, name: str) -> list[str]:
    """The feature columns without a declared kind that a training cannot read as categories, one message each with
    its fix: text whose number is ambiguous (``30,6``) or dates, which would train as unrelated levels, and text with
    more than :data:`~datamodules.codec.MAX_CATEGORIES` different values (an identifier or free text)."""
    from datamodules.codec import MAX_CATEGORIES  # noqa: PLC0415

    problems = []
    for column in frame.columns:
        if column == target or (declared.get(column) or {}).get("kind"):
            continue
        quoted = shlex.quote(str(column))
        number, date = _number_text(frame[column]), _date_text(frame[column])
        mixed = _mixed_percent(_distinct_text(frame[column]) or []) if number is not None else None
        if mixed is not None:
            texts = frame[column].dropna()
            with_sign = int(texts.str.rstrip().str.endswith("%").sum())
            bare = next(n for n in (undressed_number(mixed[1], False), undressed_number(mixed[1], True)) if n is not None)
            problems.append(f"column {column!r} of {name} writes {with_sign} of its numbers with '%' ({mixed[0]!r}) and "
                            f"{len(texts) - with_sign} without ({mixed[1]!r}): is {mixed[1]} a share ({bare * 100:g}%) "
                            f"or {mixed[1]}%?; allowed: every number of the column written one way in the file (all "
                            f"with '%', or all as plain numbers), or leave it out with --drop-columns {quoted}")
        elif number is not None:
            problems.append(f"column {column!r} of {name} holds numbers written as text ({number!r}); allowed: plain "
                            "numbers (12000, 0.35): remove currency signs, '%' and thousands separators in the file, "
                            f"or leave it out with --drop-columns {quoted}")
        elif date is not None:
            problems.append(f"column {column!r} of {name} holds dates ({date!r}); allowed: numbers or categories: "
                            f"leave it out with --drop-columns {quoted}, or turn it into a number (days since, age in "
                            "months) in the file")
        elif (strays := _stray_text(frame[column])) is not None:
            shown = ", ".join(map(repr, strays[:3])) + (" ..." if len(strays) > 3 else "")
            problems.append(f"column {column!r} of {name} holds numbers but for {len(strays)} value(s): {shown}; "
                            "allowed: a number in every row: correct those cells in the file (or empty them: a "
                            "missing value, see --impute), or declare the column categorical in --data-spec if its "
                            "numbers are codes of categories")
        elif _is_text(frame[column]) and frame[column].nunique() > MAX_CATEGORIES:
            problems.append(f"column {column!r} has {frame[column].nunique()} categories; allowed: at most "
                            f"{MAX_CATEGORIES} (an identifier or free text: leave it out with --drop-columns {quoted}; "
                            "a number: declare it continuous in --data-spec)")
    return problems


MAX_CLASSES = 20  # a target with more different values is no class label


def check_target(frame: pd.DataFrame, target: str | None, name: str) -> None:
    """A one-line ``ValueError`` for a target column a classifier cannot be trained on: none given, not a column of
    the table, one class, more than :data:`MAX_CLASSES` (an amount such as a loss: regression, which CT does not
    do), one class written several ways (:func:`class_spellings_error`), or a word for a missing value as a class
    (``NA``: a pending decision). Rows without a label do not count (a training leaves them out)."""
    error = target_column_error(target, list(frame.columns), name, frame)
    if error is not None:
        raise error
    labels = frame[target].dropna()
    classes = labels.nunique()
    if classes < 2:
        shown = f" ({labels.iloc[0]!r})" if len(labels) else ""
        raise ValueError(f"target: column {target!r} has only one class{shown} in {name}; allowed: a column with at "
                         "least two classes")
    if classes <= MAX_CLASSES:
        spelling = class_spellings_error(labels, target, name)
        if spelling is not None:
            raise spelling
        words = labels[labels.isin(MISSING_WORDS) & (labels != "None")]  # 'None': a severity, a class of its own
        if len(words):  # a pending decision written 'NA' would train as a class of its own
            shown = ", ".join(f"{word!r} ({count})" for word, count in words.value_counts().items())
            raise ValueError(f"target: column {target!r} of {name} holds {shown} (rows in brackets), words other tools "
                             "write for a missing value: they would train as a class of their own; allowed: an empty "
                             "cell or '?' for a row without a label (such rows are left out), or a class name that is "
                             "no such word")
        return
    allowed = f"allowed: a class label with at most {MAX_CLASSES} classes"
    if pd.api.types.is_numeric_dtype(labels) and not pd.api.types.is_bool_dtype(labels):
        shown = ", ".join(f"{v:g}" for v in labels.head(3))
        raise ValueError(f"target: column {target!r} of {name} holds an amount ({classes} different numbers: {shown}, "
                         f"...): predicting it is regression, which counterfactual training does not do; {allowed}, "
                         f"e.g. a column of your own that says whether {target} is above a threshold")
    raise ValueError(f"target: column {target!r} has {classes} distinct values in {name}; {allowed}")


YES_WORDS, NO_WORDS = ("y", "yes", "true"), ("n", "no", "false")  # one answer, written the ways files write it


def _class_key(label):
    """What a class label says, whatever its case: ``'Y'``, ``'y'`` and ``'Yes'`` say yes; numbers as they are."""
    if not isinstance(label, str):
        return label
    folded = label.strip().casefold()
    return "yes" if folded in YES_WORDS else "no" if folded in NO_WORDS else folded


def class_spellings_error(labels: pd.Series, target: str, name: str) -> ValueError | None:
    """A one-line ``ValueError`` where the target ``labels`` write one class several ways (``'Y'``, ``'y'``,
    ``'Yes'``; ``'Approved'``, ``'approved'``): each spelling would train as a class of its own (a yes/no decision as
    six classes), so a model of a binary decision would not be one. ``None`` where every class is written one way."""
    counts = labels.value_counts()
    groups: dict = {}
    for label in counts.index:
        groups.setdefault(_class_key(label), []).append(label)
    clashes = [sorted(group, key=lambda label: (-counts[label], str(label))) for group in groups.values()
               if len(group) > 1]  # the most rows first
    if not clashes:
        return None
    shown = "; ".join(", ".join(f"{label!r} ({counts[label]})" for label in group) for group in clashes)
    first = clashes[0]
    return ValueError(f"target: column {target!r} of {name} writes one class in several ways (rows in brackets): "
                      f"{shown}; they would train as {len(counts)} different classes; allowed: each class written one "
                      f"way in the file (e.g. {first[0]!r} for all of {', '.join(map(repr, first))})")


def thousands_points(frame: pd.DataFrame, numeric: list[str]) -> list[str]:
    """For rows to explain by a model whose training file writes decimal points: a note for each ``numeric`` column
    whose text holds a number written as much of Europe writes thousands (``"31.000"``, :data:`THOUSANDS_POINT`),
    which :func:`rows_as_written` reads with a decimal point (31), so that the reading is not silent."""
    lines = []
    for name in numeric:
        if name not in frame.columns or not _is_text(frame[name]):
            continue
        points = [v.strip() for v in frame[name] if isinstance(v, str) and THOUSANDS_POINT.fullmatch(v.strip())]
        if points:
            whole = points[0].replace(".", "")
            lines.append(f"{name}: {points[0]!r} read as {float(points[0]):g} (a decimal point, as in the training "
                         f"file), not as {whole}: write {whole} for that")
    return lines


def rows_as_written(frame: pd.DataFrame, numeric: list[str], decimal_comma: bool) -> pd.DataFrame:
    """Rows to explain (``--row``, ``--rows``) read as the training file was: text without surrounding spaces, empty
    and ``?`` cells missing, words for a missing value (``NA``, ``n/a``, ...) missing in the ``numeric`` columns,
    and, for a model trained on a file with decimal commas, the ``numeric`` columns' text in that convention
    (``"0,18"`` → 0.18, ``"31.000"`` → 31000)."""
    frame = frame.copy()
    for name in frame.columns:
        if not _is_text(frame[name]):
            continue
        values = _tidy_text(frame[name])
        if name in numeric:  # '0,18' in a file with decimal commas, '$36,428.20' as the training file wrote them
            values = values.where(~values.isin(MISSING_WORDS), None)  # 'NA', 'n/a': missing, as in training
            values = values.map(lambda v: _undressed_or_as_written(v, decimal_comma))
        frame[name] = values
    return frame
