"""File name -> language label, and which labels langchain's splitter knows.

The label is shown in reports and picks the separators the splitter tries
first (class/def boundaries for code, headings for Markdown).  Labels are
spelled as langchain_text_splitters.Language values where one exists
('js', 'cpp', 'visualbasic6'), so that the set of splittable labels is read
off that enum instead of being copied here; the other labels (yaml, shell,
notebook ...) are split as prose.
"""

from __future__ import annotations

from functools import cache
from pathlib import PurePosixPath

_BY_EXTENSION = {
    ".py": "python", ".pyi": "python", ".pyw": "python", ".pyx": "python", ".pxd": "python",
    ".js": "js", ".mjs": "js", ".cjs": "js", ".jsx": "js",
    ".ts": "ts", ".tsx": "ts", ".mts": "ts", ".cts": "ts",
    ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".scala": "scala", ".sc": "scala", ".sbt": "scala",
    ".groovy": "groovy", ".gradle": "groovy", ".gvy": "groovy",
    ".go": "go", ".rs": "rust", ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby", ".php": "php",
    ".swift": "swift", ".dart": "dart", ".zig": "zig", ".nim": "nim", ".v": "verilog", ".sv": "verilog",
    ".vhd": "vhdl", ".vhdl": "vhdl",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp", ".inl": "cpp", ".cu": "cpp", ".cuh": "cpp",
    ".m": "objc", ".mm": "objc",
    ".cs": "csharp", ".csx": "csharp", ".fs": "fsharp", ".fsi": "fsharp", ".fsx": "fsharp",
    ".vb": "visualbasic6", ".bas": "visualbasic6",
    ".lua": "lua", ".pl": "perl", ".pm": "perl", ".t": "perl", ".hs": "haskell", ".lhs": "haskell",
    ".ex": "elixir", ".exs": "elixir", ".heex": "elixir", ".erl": "erlang", ".hrl": "erlang",
    ".ml": "ocaml", ".mli": "ocaml", ".clj": "clojure", ".cljs": "clojure", ".cljc": "clojure", ".edn": "clojure",
    ".lisp": "lisp", ".el": "lisp", ".scm": "scheme", ".rkt": "racket", ".elm": "elm", ".purs": "purescript",
    ".r": "r", ".rmd": "markdown", ".jl": "julia", ".f90": "fortran", ".f95": "fortran", ".f03": "fortran",
    ".f": "fortran", ".for": "fortran", ".pas": "pascal", ".d": "d", ".cr": "crystal", ".hx": "haxe",
    ".coffee": "coffeescript", ".tcl": "tcl", ".awk": "awk", ".asm": "asm", ".s": "asm",
    ".glsl": "glsl", ".vert": "glsl", ".frag": "glsl", ".hlsl": "hlsl", ".wgsl": "wgsl", ".metal": "metal",
    ".ps1": "powershell", ".psm1": "powershell", ".psd1": "powershell", ".bat": "batch", ".cmd": "batch",
    ".sol": "sol", ".proto": "proto", ".thrift": "thrift", ".graphql": "graphql", ".gql": "graphql",
    ".prisma": "prisma", ".cob": "cobol", ".cbl": "cobol",
    ".vue": "vue", ".svelte": "svelte", ".astro": "astro",
    ".md": "markdown", ".markdown": "markdown", ".mdx": "markdown", ".rst": "rst", ".tex": "latex",
    ".sty": "latex", ".cls": "latex", ".bib": "bibtex", ".adoc": "asciidoc", ".asciidoc": "asciidoc",
    ".org": "org", ".textile": "text",
    ".html": "html", ".htm": "html", ".xhtml": "html", ".ipynb": "notebook",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".fish": "shell", ".ksh": "shell",
    ".css": "css", ".scss": "css", ".sass": "css", ".less": "css", ".styl": "css",
    ".sql": "sql", ".psql": "sql", ".json": "json", ".jsonl": "json", ".json5": "json", ".jsonc": "json",
    ".geojson": "json",
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".ini": "ini", ".cfg": "ini", ".conf": "ini",
    ".properties": "ini",
    ".tf": "hcl", ".tfvars": "hcl", ".hcl": "hcl", ".nomad": "hcl", ".nix": "nix", ".bicep": "bicep",
    ".cmake": "cmake", ".mk": "make", ".mak": "make", ".bazel": "starlark", ".bzl": "starlark",
    ".star": "starlark", ".dockerfile": "docker",
    ".xml": "xml", ".xsd": "xml", ".xsl": "xml", ".xslt": "xml", ".plist": "xml", ".csproj": "xml",
    ".fsproj": "xml", ".vbproj": "xml", ".props": "xml", ".targets": "xml", ".svg": "xml", ".wsdl": "xml",
    ".csv": "csv", ".tsv": "csv",
    ".txt": "text", ".text": "text", ".log": "text",
    ".patch": "diff", ".diff": "diff",
}

_BY_NAME = {
    "makefile": "make", "gnumakefile": "make", "dockerfile": "docker", "containerfile": "docker",
    "cmakelists.txt": "cmake", "gemfile": "ruby", "rakefile": "ruby", "podfile": "ruby", "vagrantfile": "ruby",
    "brewfile": "ruby", "fastfile": "ruby", "jenkinsfile": "groovy", "build.bazel": "starlark", "workspace.bazel": "starlark", "tiltfile": "starlark",
    "sconstruct": "python", "sconscript": "python", "snakefile": "python", "pipfile": "toml",
    "meson.build": "meson", "justfile": "make", "procfile": "text", "caddyfile": "text",
    ".bashrc": "shell", ".zshrc": "shell", ".profile": "shell", ".bash_profile": "shell",
    ".gitignore": "text", ".gitattributes": "text", ".dockerignore": "text", ".editorconfig": "ini",
    ".env.example": "dotenv", ".env.sample": "dotenv", ".env.template": "dotenv", ".env.dist": "dotenv",
    "license": "text", "copying": "text", "readme": "text", "authors": "text", "notice": "text",
    "changelog": "text", "contributing": "text",
}

@cache
def splitter_languages() -> frozenset[str]:
    """Labels that langchain's splitter has separators for: Language's values it implements.

    Not every enum member is implemented (Language.PERL raises 'not
    implemented yet' in langchain-text-splitters 1.1.3), so each is asked
    once.  Called on first use: importing langchain takes a quarter second.
    """
    from langchain_text_splitters import Language, RecursiveCharacterTextSplitter

    def implemented(language: Language) -> bool:
        try:
            RecursiveCharacterTextSplitter.get_separators_for_language(language)
        except ValueError:
            return False
        return True

    return frozenset(language.value for language in Language if implemented(language))


PROSE_LANGUAGES = {"text", "markdown", "rst", "latex", "pdf", "asciidoc", "org", "html"}


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


_SHEBANG = {"python": "python", "python3": "python", "python2": "python", "bash": "shell", "sh": "shell",
            "zsh": "shell", "ksh": "shell", "dash": "shell", "fish": "shell", "node": "js", "deno": "ts",
            "ruby": "ruby", "perl": "perl", "php": "php", "lua": "lua", "Rscript": "r", "julia": "julia",
            "tclsh": "tcl", "awk": "awk", "pwsh": "powershell", "elixir": "elixir", "escript": "erlang",
            "runghc": "haskell", "kotlin": "kotlin", "scala": "scala", "swift": "swift", "groovy": "groovy"}


def language_from_shebang(text: str) -> str:
    """'python' for '#!/usr/bin/env python3' etc.; 'text' without a known shebang."""
    if not text.startswith("#!"):
        return "text"
    words = text[2:].split("\n", 1)[0].replace("/", " ").split()
    for word in reversed(words):
        if word in _SHEBANG:
            return _SHEBANG[word]
    return "text"
