"""The one exception type for bad input: its message is shown as-is, without a traceback."""


class UsageError(Exception):
    """Bad input (grid file, command line, plugin); the message names the file, line or key."""

    def __init__(self, *lines: str):
        self.lines = [line for line in lines if line]
        super().__init__("\n".join(self.lines))


def display_path(path, rootdir) -> str:
    """A path as the user sees it: relative to ``rootdir`` when inside it."""
    from pathlib import Path

    path = Path(path)
    try:
        return path.resolve().relative_to(Path(rootdir).resolve()).as_posix()
    except ValueError:
        return str(path)


def did_you_mean(name: str, candidates, n: int = 3) -> str:
    """`` (did you mean 'a', 'b'?)`` from the close matches, or ''."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=n)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
