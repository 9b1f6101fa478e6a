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
    """``error`` as it leaves site ``site`` (marked so the server can name the site)."""
    return InputError(f"{SITE_MARK}{site}: {error}")


def site_input_error(failure) -> SiteInputError | None:
    """The site input error inside a failure Flower reports (an exception, or a result
    whose status carries the message), or ``None`` for any other failure."""
    text = str(failure[1].status.message) if isinstance(failure, tuple) else str(failure)
    match = _SITE_RE.search(text)
    if match is None:
        return None
    return SiteInputError(f"site {match.group(1)}: {match.group(2)}")
