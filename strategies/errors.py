"""The errors raised for bad input: each message is one line that names the field (and,
for a site's own data or node config, the site)."""

from __future__ import annotations

import re

#: How a site's input error starts when it leaves the site: the server finds it in the
#: failure Flower reports, whatever engine carried it.
SITE_MARK = "input error at site "
_SITE_RE = re.compile(re.escape(SITE_MARK) + r"(.+?): (.+?)(?:'>|\\n|\n|$)")


class InputError(ValueError):
    """Bad user input or setting; the message names the field and is shown as is."""


class SiteInputError(InputError):
    """A site's own data or node config is wrong: the run cannot go on without it."""


def at_site(site: str, error: Exception) -> InputError:
    """``error`` as it leaves site ``site`` (marked so the server can name the site).

    Parameters
    ----------
    site : str
        The site's name.
    error : Exception
        The error; its message follows the mark.

    Returns
    -------
    InputError
    """
    return InputError(f"{SITE_MARK}{site}: {error}")


def site_input_error(failure) -> SiteInputError | None:
    """The site input error inside a failure Flower reports (an exception, or a result
    whose status carries the message), or ``None`` for any other failure."""
    text = str(failure[1].status.message) if isinstance(failure, tuple) else str(failure)
    match = _SITE_RE.search(text)
    if match is None:
        return None
    return SiteInputError(f"site {match.group(1)}: {match.group(2)}")


def plain(value) -> str:
    """A value as a message shows it: numbers as numbers (``2``, ``0.5``; not numpy's
    ``np.int64(2)``), ``infinite`` / ``-infinite`` and ``NaN`` by name, text quoted."""
    import math

    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # a numpy scalar
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "infinite" if value > 0 else "-infinite"
        return f"{value:g}" if value == int(value) else repr(value)
    if isinstance(value, bool | int):
        return str(value)
    return repr(value)


def kind_of_bad(raw) -> str:
    """What is wrong with a table cell that is not a finite number: ``missing``,
    ``infinite`` or ``non-numeric``."""
    import math

    text = "" if raw is None else str(raw).strip()
    if text == "" or text.upper() in ("NA", "NAN", "?") or (isinstance(raw, float) and raw != raw):
        return "missing"
    try:
        return "infinite" if math.isinf(float(text)) else "non-numeric"
    except ValueError:
        return "non-numeric"


def file_line(index: int) -> str:
    """Where the data row at 0-based ``index`` sits in its file (one header line first):
    ``line 9 of the file``, the one wording every message uses."""
    return f"line {index + 2} of the file"


def bad_cell(column: str, raw, index: int) -> str:
    """``column 'x1' has a non-numeric value ('abc') at line 9 of the file`` (or a missing,
    or an infinite, value) for a table cell.

    Parameters
    ----------
    column : str
        The cell's column.
    raw : object
        The cell's value as read (shown when it is non-numeric).
    index : int
        The cell's data row, 0-based (:func:`file_line`).

    Returns
    -------
    str
    """
    kind = kind_of_bad(raw)
    shown = f" ({plain(raw)})" if kind == "non-numeric" else ""
    article = "an" if kind == "infinite" else "a"
    return f"column {column!r} has {article} {kind} value{shown} at {file_line(index)}"
