"""Build the Blocks app from a loaded model and launch it with the server's safety settings."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no usage reports to Gradio's servers unless asked

import gradio as gr  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402

from ingest.units import human_bytes  # noqa: E402

from ..cli import AppConfig
from ..engine.budget import Budget, context_budget
from ..engine.runtime import ModelRuntime
from ..session import source_files, temp_folders
from ..session.registry import SessionRegistry
from ..session.workspace_store import WorkspaceStore
from .events import input_names, wire
from .handlers import Handlers
from .login import LoginGuard
from .model_switch import ModelSwitch, picker_choices
from .replica_cookie import ReplicaCookie
from .tab_guard import TabOwnerGuard
from .ui import STATIC_DIR, LayoutInfo, build_layout

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer questions about the document."
SHARE_WARNING = """
################################################################################
#  WARNING: --share without --auth                                             #
#  Anyone with the public link can use this model and upload documents.        #
#  Add --auth USER:PASS (or --auth-file) to require a login.                   #
################################################################################
"""


def default_temperature(runtime: ModelRuntime) -> tuple[float, float]:
    """The model's own sampling defaults (Llama-2-chat: 0.6 / 0.9); greedy when it has none."""
    config = getattr(runtime.model, "generation_config", None)
    if config is not None and getattr(config, "do_sample", False):
        return float(config.temperature or 0.6), float(config.top_p or 0.9)
    return 0.0, 0.9


def build_app(config: AppConfig, runtime: ModelRuntime, budget: Budget | None = None, *,
              clock: Callable[[], float] = time.monotonic) -> tuple[gr.Blocks, Handlers]:
    """The app and its event functions; ``clock`` times the sessions' idle time-outs (SessionRegistry)."""
    budget = budget or context_budget(runtime, config.context_budget, config.memory_budget)
    temperature, top_p = default_temperature(runtime)
    store = WorkspaceStore(config.workspace_root)
    store.remove_leftovers()
    temp_folders.remove_stale()  # session folders of servers stopped or killed before
    store.downloads.clear()  # links a server stopped before left
    # Served as they are, not copied into Gradio's cache: downloads (downloads.py), and the icons and avatars,
    # whose cached copies the hourly clean-up (delete_cache) removed: every icon answered 403 after an hour; and
    # the uploads citations open (source_files.py).
    gr.set_static_paths([store.downloads.root, STATIC_DIR, source_files.served_root()])
    info = LayoutInfo(
        notice=runtime.notice, share_warning=config.share_without_auth, allow_local_paths=config.local_paths_enabled,
        budget_tokens=budget.tokens, max_file_size=human_bytes(config.max_file_size),
        system_prompt=DEFAULT_SYSTEM_PROMPT, temperature=temperature, top_p=top_p, max_new_tokens=512,
        repetition_penalty=1.0, recall=config.topk > 0, topk=config.topk or 5, quote=config.quote,
        window=runtime.window, n_starting=runtime.lm_config.n_starting, browser_secret=store.browser_secret(),
        models=tuple(picker_choices()), model=runtime.bundled_name, model_switch=config.model_switch,
        guess=config.guess,
    )
    registry = SessionRegistry(runtime, config, budget, store, clock=clock)
    defaults = {name: getattr(info, name) for name in input_names(Handlers.run)}  # the Settings panel at start
    handlers = Handlers(registry, runtime, config, budget, upload_root=get_upload_folder(), default_settings=defaults)
    demo, components = build_layout(info)
    with demo:
        wire(demo, components, handlers)
    demo.queue(max_size=config.queue_size, default_concurrency_limit=1)
    return demo, handlers


def middleware(config: AppConfig) -> list[Middleware]:
    """The page names this replica (replica_cookie.py); with --auth, a tab answers only its login (tab_guard.py)."""
    chain = [Middleware(ReplicaCookie, replica=config.replica_name)]
    return chain + [Middleware(TabOwnerGuard)] if config.auth else chain


def launch(config: AppConfig, demo: gr.Blocks, *, block: bool = True):
    """Start the server. Gradio is quiet: its start-up lines point to ``launch(share=True)``, a call users of
    this app never write; the app prints its own (the address, and the --share flag or the public link)."""
    if config.share_without_auth:
        print(SHARE_WARNING, file=sys.stderr, flush=True)
    if config.local_paths_enabled:
        print(local_paths_warning(config), file=sys.stderr, flush=True)
    css = (STATIC_DIR / "app.css").read_text(encoding="utf-8")
    js = (STATIC_DIR / "app.js").read_text(encoding="utf-8")
    result = demo.launch(
        server_name=config.host, server_port=config.port, share=config.share,
        auth=LoginGuard(config.auth) if config.auth else None,  # wrong passwords wait: login.py
        auth_message="LM-Infinite chat: please log in." if config.auth else None,
        app_kwargs={"middleware": middleware(config)},
        max_file_size=config.max_file_size, allowed_paths=[str(STATIC_DIR)], css=css, js=js,
        favicon_path=str(STATIC_DIR / "favicon.svg"), footer_links=["api", "settings"], show_error=True,
        prevent_thread_lock=True, ssr_mode=False, pwa=False, mcp_server=False, theme=gr.themes.Soft(), quiet=True,
    )
    for line in startup_lines(config, getattr(demo, "local_url", None), getattr(demo, "share_url", None)):
        print(f"[lminfinite-chat] {line}", flush=True)
    if block:
        demo.block_thread()
    return result


def serve_until_stopped(demo: gr.Blocks, switch: ModelSwitch) -> bool:
    """Serve until Ctrl-C (or SIGTERM, app.py) or until another model is asked for (Settings → Model); then close
    the server. Returns whether to start again with the model asked for (not when the user stopped it)."""
    try:
        while demo.is_running and not switch.wait(0.2):
            pass
        if switch.requested:
            print(f"[lminfinite-chat] restarting with --model {switch.model}, asked for in Settings",
                  file=sys.stderr, flush=True)
            time.sleep(1.0)  # the switch's answer reaches its page before the server goes
        restart = switch.requested
    except KeyboardInterrupt:
        restart = False
    demo.close()
    return restart


def local_paths_warning(config: AppConfig) -> str:
    """The loud start-up note of --allow-local-paths: every user can read these folders, and clone git URLs."""
    bar = "#" * 80
    lines = [bar, "#  WARNING: --allow-local-paths: every user of this app can read these folders:"]
    lines += [f"#    {root}" for root in config.local_roots]
    lines += ["#  (and everything below them; symlinks that lead outside are refused), and have the server",
              "#  clone https git URLs.", bar]
    return "\n".join(lines)


def startup_lines(config: AppConfig, local_url: str | None, share_url: str | None) -> list[str]:
    """Where the app is: its local address, then its public link, or how to get one."""
    lines = [f"Running on {local_url}" if local_url else "Running"]
    if share_url:
        lines.append(f"Public link: {share_url}")
    elif config.share:
        lines.append("No public link could be made (see the message above); the app runs locally only.")
    else:
        lines.append("Add --share for a public link.")
    return lines
