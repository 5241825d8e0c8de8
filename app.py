"""Chat with long PDFs and repositories in one unbounded LM-Infinite context: `python app.py --help`."""

from __future__ import annotations

import logging
import os
import signal
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the app sends no usage analytics unless asked


def main(argv: list[str] | None = None) -> None:
    from app.cli import parse_args

    config = parse_args(argv)  # --help exits here, before the heavy imports
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop ends the app as Ctrl-C does, cleaning up
    from app.startup import check_before_loading, load_or_explain
    from app.session import temp_folders
    from app.web.model_switch import restart_argv
    from app.web.server import build_app, launch, serve_until_stopped

    try:
        check_before_loading(config)  # the port, the workspaces folder, the device: before minutes of loading
        runtime = load_or_explain(config)
    except KeyboardInterrupt:
        raise SystemExit("[lminfinite-chat] stopped while loading the model") from None
    demo, handlers = build_app(config, runtime)
    print(f"[lminfinite-chat] {runtime.notice}; context budget {handlers.budget.tokens:,} tokens "
          f"({handlers.budget.why})", file=sys.stderr, flush=True)
    handlers.registry.start_sweeping()  # idle sessions are saved and freed on time, with or without traffic
    launch(config, demo, block=False)
    restart = serve_until_stopped(demo, handlers.model_switch)  # Ctrl-C, or another model from Settings
    saved = handlers.registry.save_all()
    temp_folders.remove_own()  # the sessions' exports
    handlers.registry.store.downloads.clear()  # and the links their downloads were served from
    print(f"[lminfinite-chat] stopped; saved {saved} workspace{'' if saved == 1 else 's'} changed since its last save",
          file=sys.stderr, flush=True)
    if restart:  # the same command and flags with the model asked for: same address and port (model_switch.py)
        from ingest.pdf import stop_worker

        stop_worker()  # no exit handlers run across exec: its PDF worker process would be left behind
        args = restart_argv(sys.argv[1:] if argv is None else argv, handlers.model_switch.model)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *args])


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":  # required: ingest's PDF worker is a 'spawn' process that re-imports this module
    main()
