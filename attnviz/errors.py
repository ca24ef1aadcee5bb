"""The one error type a user sees: its message is printed as a single line and the command exits 2."""


class AttnvizError(ValueError):
    """Bad input or an unusable environment, explained in one line."""
