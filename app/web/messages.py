"""Messages to the person at the browser, with every character shown as itself.

Gradio renders a toast's text (gr.Info, gr.Warning, gr.Error) as HTML, and a gr.Markdown note as Markdown with
HTML: a workspace named ``<img src=//host/x>`` or ``![x](//host/x)`` would load an image from another host in
the toast that reopens it, and, without --auth, in every user's browser that opens it from the shared list.
The messages here hold no markup of their own, so each is escaped whole: what it quotes (a name, a file, an
error) can be anything.
"""

from __future__ import annotations

import html
import re

import gradio as gr

ANOTHER_USERS_SESSION = "This session belongs to another user."  # a leaked session hash, with --auth

_MARKDOWN = re.compile(r"([\\`*_\[\]()!#|~{}+\-])")  # what starts emphasis, code, a link, an image or a heading


def toast_text(text) -> str:
    """``text`` as the HTML of a toast that shows it literally."""
    return html.escape(str(text), quote=False)


def markdown_text(text) -> str:
    """``text`` as the Markdown of a note that shows it literally: HTML and Markdown's own marks escaped."""
    return html.escape(_MARKDOWN.sub(r"\\\1", str(text)), quote=False)


def info(text) -> None:
    gr.Info(toast_text(text))


def warning(text) -> None:
    gr.Warning(toast_text(text))


def error(text) -> gr.Error:
    """A gr.Error to raise, its message escaped."""
    return gr.Error(toast_text(text))
