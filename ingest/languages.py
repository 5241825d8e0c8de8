"""File name -> language label, and label -> langchain splitter language.

The label is shown in reports and picks the separators the splitter tries
first (class/def boundaries for code, headings for Markdown).
"""

from __future__ import annotations

from pathlib import PurePosixPath

_BY_EXTENSION = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "js", ".mjs": "js", ".cjs": "js", ".jsx": "js",
    ".ts": "ts", ".tsx": "ts", ".mts": "ts",
    ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".scala": "scala",
    ".go": "go", ".rs": "rust", ".rb": "ruby", ".php": "php", ".swift": "swift",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".hxx": "cpp", ".cu": "cpp", ".cuh": "cpp", ".cs": "csharp", ".lua": "lua", ".pl": "perl",
    ".pm": "perl", ".hs": "haskell", ".ex": "elixir", ".exs": "elixir", ".ps1": "powershell",
    ".r": "r", ".sol": "sol", ".proto": "proto", ".cob": "cobol", ".cbl": "cobol",
    ".md": "markdown", ".markdown": "markdown", ".rst": "rst", ".tex": "latex",
    ".html": "html", ".htm": "html",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".fish": "shell",
    ".css": "css", ".scss": "css", ".sql": "sql", ".json": "json", ".jsonl": "json",
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".ini": "ini", ".cfg": "ini",
    ".xml": "xml", ".svg": "xml", ".csv": "csv", ".tsv": "csv", ".ipynb": "json",
    ".txt": "text", ".text": "text", ".log": "text",
}

_BY_NAME = {
    "makefile": "make", "gnumakefile": "make", "dockerfile": "docker", "cmakelists.txt": "cmake",
    "gemfile": "ruby", "rakefile": "ruby", "jenkinsfile": "groovy", "license": "text",
    "copying": "text", "readme": "text", "authors": "text", "notice": "text",
}

# Labels that langchain_text_splitters.Language knows (its enum values).
SPLITTER_LANGUAGES = {
    "cpp", "go", "java", "kotlin", "js", "ts", "php", "proto", "python", "r", "rst", "ruby", "rust",
    "scala", "swift", "markdown", "latex", "html", "sol", "csharp", "cobol", "c", "lua", "perl",
    "haskell", "elixir", "powershell",
}

PROSE_LANGUAGES = {"text", "markdown", "rst", "latex", "pdf"}


def language_for(path: str) -> str:
    """Language label for a file path ('text' when unknown)."""
    p = PurePosixPath(path)
    name = p.name.lower()
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith("dockerfile"):
        return "docker"
    return _BY_EXTENSION.get(p.suffix.lower(), "text")


def is_readme(name: str) -> bool:
    """README, README.md, readme.rst ... (a file name, not a path)."""
    stem = name.lower().split(".", 1)[0]
    return stem == "readme"


_SHEBANG = {"python": "python", "python3": "python", "bash": "shell", "sh": "shell", "zsh": "shell",
            "node": "js", "ruby": "ruby", "perl": "perl"}


def language_from_shebang(text: str) -> str:
    """'python' for '#!/usr/bin/env python3' etc.; 'text' without a known shebang."""
    if not text.startswith("#!"):
        return "text"
    words = text[2:].split("\n", 1)[0].replace("/", " ").split()
    for word in reversed(words):
        if word in _SHEBANG:
            return _SHEBANG[word]
    return "text"
