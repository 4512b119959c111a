"""Errors a user can cause and fix; their message says what to do. Anything else is a bug."""


class UserError(ValueError):
    """Bad input or configuration. Front ends show the message alone, without a traceback."""
