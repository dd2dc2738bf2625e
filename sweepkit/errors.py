"""The one exception type for bad input: its message is shown as-is, without a traceback."""


class UsageError(Exception):
    """Bad input (grid file, command line, plugin); the message names the file, line or key."""

    def __init__(self, *lines: str):
        self.lines = [line for line in lines if line]
        super().__init__("\n".join(self.lines))
