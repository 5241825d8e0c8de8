"""Which repository paths are noise, and why.

A repository's useful text is its sources and docs; version-control data,
build outputs, dependencies, lock files and binaries only burn context.  Each
rule returns a human reason so the report can say why a path was skipped.
These rules apply inside folders, zips and clones, not to files the user
picked one by one.
"""

from __future__ import annotations

import fnmatch
from pathlib import PurePosixPath

VCS_DIRS = {".git", ".hg", ".svn", ".bzr", "CVS", "_darcs", ".jj"}

BUILD_DIRS = {
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox", ".eggs", ".venv",
    "venv", ".ipynb_checkpoints", "build", "dist", "target", "out", ".next", ".nuxt", ".gradle",
    ".cache", "htmlcov", ".coverage_html", "cmake-build-debug", "cmake-build-release", ".terraform",
    ".idea", ".vs",
}
DEPENDENCY_DIRS = {"node_modules", "bower_components", "vendor", "vendored", "third_party", "site-packages",
                   "Pods", "jspm_packages"}

LOCK_FILES = {
    "package-lock.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock", "Pipfile.lock", "Cargo.lock",
    "Gemfile.lock", "composer.lock", "go.sum", "uv.lock", "pdm.lock", "flake.lock", "mix.lock",
    "packages.lock.json", "npm-shrinkwrap.json", "bun.lockb",
}
GENERATED_PATTERNS = ("*.min.js", "*.min.css", "*.map", "*.lock", "*.pyc", "*.pyo")
SECRET_PATTERNS = (".env", ".env.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "*.p12", "*.pfx", ".netrc")
# Committed templates of secret files: names and placeholders only.
SECRET_TEMPLATES = {".env.example", ".env.sample", ".env.template", ".env.dist", ".env.defaults.example"}

BINARY_EXTENSIONS = {
    # images, audio, video, fonts
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".ico", ".icns", ".tif", ".tiff", ".webp", ".psd", ".heic",
    ".mp3", ".wav", ".flac", ".ogg", ".m4a", ".mp4", ".mov", ".avi", ".mkv", ".webm",
    ".ttf", ".otf", ".woff", ".woff2", ".eot",
    # compiled code and libraries
    ".exe", ".dll", ".so", ".dylib", ".o", ".obj", ".a", ".lib", ".class", ".pyd", ".wasm", ".bin",
    # data, models, databases
    ".npy", ".npz", ".pt", ".pth", ".ckpt", ".safetensors", ".onnx", ".pkl", ".pickle", ".h5", ".hdf5",
    ".parquet", ".arrow", ".feather", ".db", ".sqlite", ".sqlite3", ".mdb",
    # office documents we do not parse
    ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".epub",
}
# Why an explicitly picked binary document is not read, and what to do instead.
UNSUPPORTED_DOCUMENTS = {
    ".doc": "Word", ".docx": "Word", ".odt": "OpenDocument text", ".epub": "EPUB",
    ".xls": "Excel", ".xlsx": "Excel", ".ods": "OpenDocument spreadsheet",
    ".ppt": "PowerPoint", ".pptx": "PowerPoint", ".odp": "OpenDocument presentation",
}


def unsupported_document_reason(suffix: str) -> str | None:
    """'Word documents (.docx) are not read; ...' for office formats, else None."""
    kind = UNSUPPORTED_DOCUMENTS.get(suffix)
    if kind is None:
        return None
    return f"{kind} documents ({suffix}) are not read; export the file as PDF or text"


ARCHIVE_EXTENSIONS = {".zip", ".jar", ".war", ".whl", ".egg", ".apk", ".tar", ".gz", ".tgz", ".bz2", ".xz",
                      ".zst", ".7z", ".rar", ".lz", ".lzma", ".iso", ".dmg", ".deb", ".rpm", ".nupkg"}


def archive_reason(suffix: str, compressed: bool) -> str:
    """Why an explicitly picked archive that is not read as a repository is skipped: a format we do not list,
    or a .zip or .tar compressed once more on its own (repo.zip.gz), whose inside we do not list either."""
    if compressed and suffix in (".zip", ".tar"):
        return f"a {suffix} compressed again; upload the {suffix} itself"
    return f"unsupported archive format ({suffix}); upload repositories as .zip, .tar, .tar.gz or .tgz"


def dir_skip_reason(name: str) -> str | None:
    """Reason to skip a whole folder by its name, or None to walk it."""
    if name in VCS_DIRS:
        return "version-control folder"
    if name in DEPENDENCY_DIRS:
        return "dependency/vendored folder"
    if name in BUILD_DIRS or name.endswith(".egg-info"):
        return "build output or cache folder"
    return None


def file_skip_reason(path: str) -> str | None:
    """Reason to skip a repository file by its name, or None to read it."""
    p = PurePosixPath(path)
    name = p.name
    lower = name.lower()
    if name in LOCK_FILES:
        return "lock file"
    if lower not in SECRET_TEMPLATES and any(fnmatch.fnmatchcase(lower, pat) for pat in SECRET_PATTERNS):
        return "may contain secrets"
    if any(fnmatch.fnmatchcase(lower, pat) for pat in GENERATED_PATTERNS):
        return "generated or minified file"
    suffix = p.suffix.lower()
    if suffix in ARCHIVE_EXTENSIONS:
        return "archive inside a repository or archive (not opened)"
    if suffix in BINARY_EXTENSIONS:
        return f"binary file ({suffix})"
    return None
