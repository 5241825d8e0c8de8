""".gitignore semantics (root and nested files) on top of pathspec.

Git reads a .gitignore in every folder; patterns are relative to that folder
and the deepest file with a matching pattern decides (a `!negation` there can
re-include).  A path inside an ignored folder stays ignored, which the walkers
get for free by not descending into folders this matcher ignores.
"""

from __future__ import annotations

from typing import Callable, Iterable

import pathspec


def _verdict(spec: pathspec.PathSpec, path: str) -> bool | None:
    """True ignore, False re-include, None no pattern matched."""
    check = getattr(spec, "check_file", None)
    if check is not None:
        return check(path).include
    verdict = None
    for pattern in spec.patterns:  # pathspec < 0.12: last matching pattern wins
        if pattern.include is not None and pattern.match_file(path) is not None:
            verdict = pattern.include
    return verdict


class GitIgnoreMatcher:
    """Answers 'is this repository path ignored?' for posix relative paths.

    `read_ignore_file(folder)` returns the lines of `folder/.gitignore`
    ('' is the root) or None; it is called once per folder, lazily, so the
    same matcher works for folders on disk and for zip archives.
    """

    def __init__(self, read_ignore_file: Callable[[str], Iterable[str] | None],
                 extra_root_lines: Iterable[str] = ()) -> None:
        self._read = read_ignore_file
        self._specs: dict[str, pathspec.PathSpec | None] = {}
        self._extra = pathspec.GitIgnoreSpec.from_lines(list(extra_root_lines)) if extra_root_lines else None

    def _spec(self, folder: str) -> pathspec.PathSpec | None:
        if folder not in self._specs:
            lines = self._read(folder)
            self._specs[folder] = pathspec.GitIgnoreSpec.from_lines(list(lines)) if lines else None
        return self._specs[folder]

    def ignored(self, path: str, is_dir: bool = False) -> bool:
        """True when git would ignore `path` (relative, '/'-separated)."""
        parts = path.strip("/").split("/")
        target = "/".join(parts) + ("/" if is_dir else "")
        # Deepest .gitignore first: the first decisive answer wins.
        for depth in range(len(parts) - 1, -1, -1):
            folder = "/".join(parts[:depth])
            spec = self._spec(folder)
            if spec is None:
                continue
            relative = target[len(folder) + 1:] if folder else target
            verdict = _verdict(spec, relative)
            if verdict is not None:
                return verdict
        if self._extra is not None:
            return bool(_verdict(self._extra, target))
        return False
