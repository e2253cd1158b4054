"""The one exception type for bad user input.

The CLI catches it and prints one line, `nanscope <command>: error: <message>`, then exits 2.
Raise it with a message that names the file, the field and the sample where they apply.
"""


class UserError(ValueError):
    """Bad user input: a file, flag or field the user can fix."""
