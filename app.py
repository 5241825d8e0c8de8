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
    from app.engine.model_loading import choose_model, load_runtime
    from app.web.server import build_app, launch

    choice = choose_model(config)
    print(f"[lminfinite-chat] model: {choice.name_or_path} ({choice.reason})", file=sys.stderr, flush=True)
    runtime = load_runtime(config, choice)
    demo, handlers = build_app(config, runtime)
    print(f"[lminfinite-chat] {runtime.notice}; context budget {handlers.budget.tokens:,} tokens "
          f"({handlers.budget.why})", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop ends the server as Ctrl-C does
    launch(config, demo)  # returns when the server is stopped
    saved = handlers.registry.save_all()
    print(f"[lminfinite-chat] stopped; saved {saved} workspace{'' if saved == 1 else 's'} changed since its last save",
          file=sys.stderr, flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":  # required: ingest's PDF worker is a 'spawn' process that re-imports this module
    main()
