"""An Excel workbook (``.xlsx``; ``.xlsm``, whose macros are never run) as a table file: its sheet, named after
``#``, and its cells as a CSV writes them.

``loans.xlsx`` names a workbook of one sheet; ``loans.xlsx#Applications`` its sheet ``Applications`` (the one way to
pick a sheet, so that ``--data``, ``--rows``, compare.py's list and a run's recorded data name a table alike). A
workbook of several sheets without ``#``, or with a sheet it lacks, is refused in one line naming its sheets.

:func:`workbook_cells` reads the sheet with openpyxl, each cell's stored value (the value a formula last computed,
as pandas reads it), row 1 as the header, and writes every cell as the text a CSV saved from Excel would hold:
numbers in full, in the unit their number format shows (a cell shown as ``7.5%`` holds 0.075 and is written
``7.5%``, one shown as ``$1,200.00`` is written so: :func:`number_look`), text as typed (``$1,200`` is then read as
a CSV's cell is), dates as ``2023-01-05``, ``TRUE``/``FALSE``. :func:`~datamodules.table_format.read_table` then
reads that text as it reads a CSV's, so that a workbook gets the same columns, notes and refusals as the same table
saved as CSV. A formula without a stored value (a file written by a program that computes none) is refused rather
than read as a gap.

Plain Python at import (the command lines ask :func:`split_sheet` before pandas is loaded); openpyxl on reading.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from decimal import Decimal
from functools import lru_cache
from itertools import chain
from pathlib import Path

WORKBOOK_SUFFIXES = (".xlsx", ".xlsm")  # .xlsm: a workbook with macros; its cells are read, its macros never
OLD_EXCEL = (".xls",)  # binary Excel (97-2003): another reader (xlrd); refused with what to save it as
OLD_EXCEL_FIX = "an .xlsx or .csv file: open it in Excel and save it as 'Excel Workbook (.xlsx)' or as CSV"
SHEET = re.compile(r"(?is)(.*\.xls[xm])#(.*)")  # loans.xlsx#Applications: the workbook, then its sheet


def split_sheet(value) -> tuple[str, str | None]:
    """``"loans.xlsx#Applications"`` → ``("loans.xlsx", "Applications")``; any other value → ``(value, None)``."""
    match = SHEET.fullmatch(str(value))
    return (match.group(1), match.group(2)) if match else (str(value), None)


def table_file(value) -> str:
    """The file a table value names, without its ``#sheet``."""
    return split_sheet(value)[0]


def table_label(value) -> str:
    """How runs, table rows and model names call a table file: its stem (``loans`` for ``/x/loans.csv``), and a
    sheet named after ``#`` after a hyphen (``book-Applications`` for ``book.xlsx#Applications``), so that two sheets
    of one workbook are told apart."""
    path, sheet = split_sheet(value)
    return Path(path).stem + ("" if sheet is None else f"-{sheet}")


def resolved(value) -> str:
    """A table value with its file as an absolute path and its ``#sheet`` kept (the run's configuration holds it)."""
    path, sheet = split_sheet(value)
    return str(Path(path).resolve()) + ("" if sheet is None else f"#{sheet}")


def is_old_excel(value) -> bool:
    """Whether ``value`` names a binary Excel workbook (``.xls``), refused with :data:`OLD_EXCEL_FIX`."""
    return isinstance(value, (str, Path)) and Path(str(value)).suffix.lower() in OLD_EXCEL


def _text(value, look: tuple | None = None, comma: bool = False):
    """A cell's value as a CSV from Excel holds it: numbers in full, ``TRUE``/``FALSE``, a date at midnight as
    ``2023-01-05``; text as typed, an empty cell ``None``. ``look``: the cell's number format where it shows a
    unit a CSV's reader understands (:func:`number_look`): the number in full with that unit, as Excel shows it
    (0.075 under ``0.0%`` → ``7.5%``, 1200 under ``"$"#,##0.00`` → ``$1,200.00``). ``comma``: numbers as Excel
    writes them where the decimal separator is a comma (:func:`writes_decimal_commas`: ``1.200,00 €``, ``0,5``)."""
    if look is not None and type(value) in (int, float):
        text = _shown(value, *look)
        return text.translate(COMMA_POINT) if comma else text
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        text = repr(value)  # the shortest text that reads back as the same float
        return text.replace(".", ",") if comma else text
    if isinstance(value, dt.datetime) and value.time() == dt.time():
        return value.date().isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    return str(value)


@lru_cache(maxsize=1 << 14, typed=True)  # a column repeats its numbers (rates, fees): each one's text made once
def _shown(value, prefix: str, suffix: str, percent: bool, decimals: int, grouped: bool) -> str:
    """A number as Excel shows it under a format of :func:`number_look`, but in full (never rounded to the
    format's decimals, which Excel shows at least): 0.0755 under ``0.0%`` → ``7.55%``, -1200 under ``"$"#,##0.00``
    → ``-$1,200.00``."""
    number = Decimal(repr(value) if isinstance(value, float) else value)
    if percent:
        number = number.scaleb(2)  # 0.075 → 7.5, exactly as its text reads (no 7.500000000000001)
    places = max(decimals, -min(0, number.normalize().as_tuple().exponent))
    digits = format(abs(number), f"{',' if grouped else ''}.{places}f")
    return f"{'-' if number < 0 else ''}{prefix}{digits}{suffix}{'%' if percent else ''}"


UNITS = "$€£¥"  # the currency signs the CSV reader keeps as a unit (datamodules.table_format.CURRENCY)
FORMAT_PART = re.compile(r'"([^"]*)"|\\(.)|\[\$([^\]-]*)[^\]]*\]|\[[^\]]*\]|[_*](.)|([0#?])|(.)', re.S)


@lru_cache(maxsize=1024)
def number_look(number_format: str | None) -> tuple | None:
    """What Excel's ``number_format`` adds to a number that a CSV's reader reads as a unit, as
    ``(prefix, suffix, percent, decimals, grouped)`` for :func:`_shown`: a percent (``0.0%``) or one currency sign
    of :data:`UNITS` (``"$"#,##0.00``, ``#,##0 "€"``, Excel's ``[$€-407] #,##0``, accounting's ``_("$"* #,##0_)``);
    ``None`` for every other format (``General``, ``0.00``, ``#,##0``, dates, text, and other units, such as
    ``#,##0 "kr"`` or ``[$CHF] 0.00``, whose numbers are read bare rather than with a wrong unit). Only the format's
    first section (positive numbers) counts."""
    if not number_format or number_format == "General":
        return None
    before, after, percent, decimals, grouped, digits, point = [], [], False, 0, False, False, False
    for quoted, escaped, symbol, padding, digit, other in FORMAT_PART.findall(number_format):
        literal = quoted or escaped or symbol
        if other == ";":
            break  # the next sections: negative numbers, zero, text
        if digit:
            digits, decimals = True, decimals + (point and digit == "0")
        elif other == ".":
            point = True
        elif other == "," and digits and not point:
            grouped = True
        elif other == "%":
            percent = True
        elif other and (other.isalpha() or other == "@"):
            return None  # a date, scientific (0.00E+00) or text format
        elif padding or not (literal or other):
            continue  # _) and * : the width of a character, a fill; [Red], [>100]: colours, conditions
        else:
            (after if digits else before).append(literal or other)
    prefix, suffix = "".join(before).lstrip(), "".join(after).rstrip()
    if percent:
        return ("", "", True, decimals, grouped) if digits and not (prefix + suffix).strip(" ") else None
    sign = (prefix + suffix).strip(" ")
    if not digits or len(sign) != 1 or sign not in UNITS:
        return None
    return prefix, suffix, False, decimals, grouped


def numbered_styles(cell_class) -> bool:
    """Whether openpyxl's read-only cells (``cell_class``) keep their style's number, a private name
    (:func:`_style_keys`); a release without it is read by each cell's number format."""
    return hasattr(cell_class, "_style_id")


def _style_keys(row, numbered: bool) -> list:
    """Each cell's style in ``row`` (a read-only sheet's): its number where openpyxl keeps one (``numbered``: its
    private ``_style_id``; a sheet of 20 000 rows uses a few, so :func:`_formats` asks each one's number format once,
    where ``ReadOnlyCell.number_format`` per cell costs the reading a fifth of its time), else its number format."""
    return [getattr(cell, "_style_id", 0) for cell in row] if numbered else [cell.number_format for cell in row]


def _formats(sheet, styles: list[list]) -> dict:
    """The number format of each style the cells ``styles`` (by row, :func:`_style_keys`) use: a style's number,
    whose number format is asked once, or a number format itself."""
    from openpyxl.cell.read_only import ReadOnlyCell  # noqa: PLC0415

    used = set(chain.from_iterable(styles))
    return {style: style if style is None or isinstance(style, str) else
            ReadOnlyCell(sheet, 1, 1, None, style_id=style).number_format for style in used}


COMMA_POINT = str.maketrans(",.", ".,")  # 1,200.50 → 1.200,50
LOCALE_TAG = re.compile(r"\[\$[^\]]*-([0-9A-Fa-f]{3,4})\]")  # [$€-407]: the format's locale, a Windows LCID
# languages (an LCID's low ten bits) whose numbers take a decimal comma: German, French, Spanish, Italian, Dutch,
# Portuguese, Danish, Swedish, Finnish, Norwegian, Polish, Czech, Russian; their Swiss locales write a decimal point
COMMA_LANGUAGES = {0x07, 0x0C, 0x0A, 0x10, 0x13, 0x16, 0x06, 0x1D, 0x0B, 0x14, 0x15, 0x05, 0x19}
POINT_LOCALES = {0x0807, 0x100C, 0x0810, 0x1407}  # de-CH, fr-CH, it-CH, de-LI


@lru_cache(maxsize=1024)
def comma_format(number_format: str | None) -> bool | None:
    """What a cell's ``number_format`` says of the separators Excel shows its number with: ``True`` for a decimal
    comma (an amount with the € after the number, ``#,##0.00 "€"``, as Excel writes amounts in much of Europe; a
    locale tag of such a language, ``[$€-407]``), ``False`` for a decimal point (a currency sign before the number,
    ``"$"#,##0.00``, ``€1,200``, without such a tag; a tag of another language), ``None`` where it says nothing
    (``General``, ``0.00``, ``0.0%``: Excel shows them in the reader's own locale)."""
    tag = LOCALE_TAG.search(number_format or "")
    if tag:
        lcid = int(tag.group(1), 16)
        return (lcid & 0x3FF) in COMMA_LANGUAGES and lcid not in POINT_LOCALES
    look = number_look(number_format)
    if look is None or look[2]:
        return None
    prefix, suffix = look[0], look[1]
    return True if "€" in suffix else False if prefix.strip() else None


def writes_decimal_commas(formats) -> bool:
    """Whether a sheet whose cells use the number ``formats`` shows its numbers with decimal commas: some format
    says so (:func:`comma_format`) and none says otherwise (a sheet of ``1.200,00 €`` amounts beside ``$1,200``
    ones keeps decimal points)."""
    said = {comma_format(number_format) for number_format in formats} - {None}
    return said == {True}


def _column_letter(index: int) -> str:
    """Excel's letter of a column (0 → ``A``, 27 → ``AB``)."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


def _typed(text: str) -> str:
    """``text`` as a shell takes it: as it is where it can (``loans.xlsx#Applications``), else quoted."""
    return text if re.fullmatch(r"[\w.#/:+-]+", text) else shlex.quote(text)


def _chosen_sheet(names: list[str], sheet: str | None, path: str, value: str, option: str) -> str:
    """The sheet to read: the only one, or the one named after ``#``; a one-line ``TableError`` otherwise."""
    from datamodules.suggest import name_hint  # noqa: PLC0415
    from datamodules.table_format import TableError  # noqa: PLC0415

    shown = ", ".join(map(repr, names))
    if sheet is None and len(names) > 1:
        raise TableError(option, value, f"{Path(path).name} has {len(names)} sheets ({shown}): which one holds the "
                         "table?", "the sheet named after '#': "
                         + ", ".join(_typed(f"{path}#{name}") for name in names))
    if sheet is not None and sheet not in names:
        raise TableError(option, value, f"{Path(path).name} has no sheet {sheet!r}{name_hint(sheet, names)}",
                         f"one of its sheets: {shown}")
    return names[0] if sheet is None else sheet


FORMULA_TAG = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?f[\s>/]")  # a cell's <f>: the formula beside its stored <v>


def _holds_formulas(path: Path) -> bool:
    """Whether a worksheet of the workbook holds a formula, from its XML text (read in pieces): a workbook without
    one needs no second reading to tell a formula without a stored value from an empty cell."""
    import zipfile  # noqa: PLC0415

    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if not (name.startswith("xl/worksheets/") and name.endswith(".xml")):
                continue
            with archive.open(name) as part:
                tail = b""
                while chunk := part.read(1 << 20):
                    if FORMULA_TAG.search(tail + chunk):
                        return True
                    tail = chunk[-64:]
    return False


def _unset_formulas(path: Path, sheet: str, gaps: set[tuple[int, int]], value: str, option: str) -> None:
    """A one-line ``TableError`` where a cell of ``gaps`` (empty as stored: row, column) holds a formula: a value
    Excel never computed, which a training must not read as a missing value."""
    import openpyxl  # noqa: PLC0415
    from datamodules.table_format import TableError  # noqa: PLC0415

    book = openpyxl.load_workbook(path, read_only=True, data_only=False)
    try:
        found = [(r, c, cell) for r, row in enumerate(book[sheet].iter_rows(values_only=True))
                 for c, cell in enumerate(row) if (r, c) in gaps and cell is not None]
    finally:
        book.close()
    if found:
        r, c, formula = found[0]
        text = getattr(formula, "text", formula)  # an array formula's text
        raise TableError(option, value, f"{len(found)} cell(s) of {Path(value).name} hold a formula without a stored "
                         f"value (first: {_column_letter(c)}{r + 1}, {text}): the file was written by a program that "
                         "does not compute formulas", "a workbook saved by Excel or LibreOffice (open it and save it: "
                         "each formula's value is stored), or the formulas pasted as values")


def _check_first_row(rows: list[list], value: str, option: str) -> None:
    """A one-line ``TableError`` where row 1 names fewer than half of the columns holding values (a title such as
    ``Loan book 2023`` above the table, or empty rows first): the names are on a lower row, and the table read from
    row 1 would hold them as data. One unnamed column (an index pandas wrote) is a CSV's ``Unnamed: 0``."""
    from datamodules.table_format import TableError  # noqa: PLC0415

    named = [cell for cell in rows[0] if cell is not None and str(cell).strip()]
    filled = [c for c in range(len(rows[0])) if any(row[c] is not None for row in rows[1:])]
    if len(filled) >= 2 and 2 * len(named) < len(filled):
        shown = f" (only {', '.join(repr(str(cell)) for cell in named)})" if named else ""
        raise TableError(option, value, f"row 1 of {Path(value).name} names {len(named)} of its {len(filled)} columns"
                         f"{shown}: are the column names on a lower row, below a title?", "a sheet whose row 1 holds "
                         f"the column names: {_rows_to_delete(rows, len(filled))}")


def _rows_to_delete(rows: list[list], filled: int) -> str:
    """What to delete so that row 1 holds the column names: the rows above the first of the top rows whose cells
    are text in at least half of the ``filled`` columns (``delete rows 1 to 2 (row 3 holds 'Alter', ...)``), or
    the rows above them where no such row is near the top."""
    for r, row in enumerate(rows[1:20], start=2):
        texts = [str(cell).strip() for cell in row if isinstance(cell, str) and cell.strip()]
        if len(texts) >= 2 and 2 * len(texts) >= filled and len(texts) == sum(cell is not None for cell in row):
            above = "row 1" if r == 2 else f"rows 1 to {r - 1}"
            shown = ", ".join(map(repr, texts[:3])) + (", ..." if len(texts) > 3 else "")
            return f"delete {above} (row {r} holds {shown})"
    return "delete the rows above them"


def _table_sheets(book) -> list[str]:
    """The names of ``book``'s sheets that can hold a table: its worksheets, not its chart sheets."""
    return [worksheet.title for worksheet in book.worksheets]


def check_sheet(value, option: str = "data") -> str:
    """The sheet ``value`` names (``loans.xlsx``, ``loans.xlsx#Applications``), checked against the workbook's sheets
    without reading its cells: the one-line ``TableError`` of :func:`workbook_cells` for several sheets and none
    named, or a sheet it lacks, naming ``option`` and ``value`` as given."""
    import openpyxl  # noqa: PLC0415

    path, sheet = split_sheet(value)
    book = openpyxl.load_workbook(path, read_only=True)
    try:
        names = _table_sheets(book)
    finally:
        book.close()
    return _chosen_sheet(names, sheet, path, str(value), option)


def workbook_cells(value, option: str = "data"):
    """The sheet ``value`` names (``loans.xlsx``, ``loans.xlsx#Applications``) as a DataFrame of text cells
    (:func:`_text`) whose columns are row 1's names (an empty name: ``Unnamed: N``, as pandas names a CSV's), the
    note saying which sheet was read, and whether its numbers are written with decimal commas
    (:func:`writes_decimal_commas`: the cells are then ``1.234,5``, as such an Excel saves them as CSV). One-line
    ``TableError`` naming ``option``: several sheets and none named,
    an unknown sheet, a formula without a stored value. Rows and columns left empty at the end stay for the CSV
    reader's tidying, which leaves them out."""
    import openpyxl  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415
    from openpyxl.cell.read_only import ReadOnlyCell  # noqa: PLC0415

    path, sheet = split_sheet(value)
    book = openpyxl.load_workbook(path, read_only=True, data_only=True)  # data_only: each formula's stored value
    numbered = numbered_styles(ReadOnlyCell)
    try:
        names = _table_sheets(book)
        sheet = _chosen_sheet(names, sheet, path, str(value), option)
        rows, styles = [], []  # each cell's value and its style's number (its number format: _formats)
        for row in book[sheet].iter_rows():
            rows.append([cell.value for cell in row])
            styles.append(_style_keys(row, numbered))
        formats = _formats(book[sheet], styles)
    finally:
        book.close()
    looks = {style: number_look(number_format) for style, number_format in formats.items()}
    comma = writes_decimal_commas(formats.values())
    width = max((len(row) for row in rows), default=0)
    rows, styles = ([row + [fill] * (width - len(row)) for row in table] for table, fill in ((rows, None), (styles, 0)))
    gaps = {(r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell is None}
    if gaps and _holds_formulas(Path(path)):  # a formula without a stored value reads as an empty cell
        _unset_formulas(Path(path), sheet, gaps, str(value), option)
    if not rows:
        return pd.DataFrame(), [], False
    _check_first_row(rows, str(value), option)
    header = [f"Unnamed: {c}" if cell is None else str(_text(cell)) for c, cell in enumerate(rows[0])]
    cells = pd.DataFrame([[_text(cell, looks.get(style), comma) for cell, style in zip(row, shown)] for row, shown in
                          zip(rows[1:], styles[1:])], columns=header, dtype="str")  # as read_csv
    note = f"{Path(path).name}: sheet {sheet!r}" + (f" of {len(names)}" if len(names) > 1 else "") + \
        ", each cell's stored value, in the units Excel shows it with (a cell shown as 7.5% is 7.5 with its %)"
    if comma:
        shown = next(f for f in sorted(f for f in formats.values() if f) if comma_format(f))
        note += (f"; its number format {shown} writes amounts as Excel does in much of Europe (1.234,50 €): "
                 "numbers are shown with decimal commas, and rows to explain may write them so")
    return cells, [note], comma
