"""The error raised for bad input: its message is one line that names the field."""


class InputError(ValueError):
    """Bad user input or setting; the message names the field and is shown as is."""
