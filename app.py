"""Chat with long PDFs and repositories in one unbounded LM-Infinite context: `python app.py --help`."""

from __future__ import annotations

import logging
import os
import signal
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the app sends no usage analytics unless asked
# OpenMP's threads wait asleep, not spinning (read when torch loads OpenMP, so before it is imported): beside
# another process on the same cores (a second replica, a PDF being read) spinning threads take the cores it needs.
# The 0.5B on 2 threads, 2 cores: two processes side by side decoded in 24-25 s each where spinning took 49-51
# (prefill-heavy: 40-47 against 85-91). Alone it costs up to a tenth: prefill-heavy the same wall time (0.99×),
# decode-heavy 22.3 against 20.1 s (medians of 5 in turn, on a machine whose runs vary by a tenth).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> None:
    from app.cli import parse_args

    config = parse_args(argv)  # --help exits here, before the heavy imports
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop ends the app as Ctrl-C does, cleaning up
    from app.startup import check_before_loading, load_or_explain
    from app.session import temp_folders
    from app.web.model_switch import restart, restart_argv, switched_from
    from app.web.server import build_app, launch, serve_until_stopped

    argv = sys.argv[1:] if argv is None else argv
    before_switch = switched_from()  # this start is a switch from Settings: the flags it came from
    try:
        check_before_loading(config)  # the port, the workspaces folder, the device: before minutes of loading
        runtime = load_or_explain(config)
    except KeyboardInterrupt:
        raise SystemExit("[lminfinite-chat] stopped while loading the model") from None
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - after a switch, any failure to load falls back
        if before_switch is None:
            raise
        print(f"{exc}\n[lminfinite-chat] the model switched to cannot be loaded: starting again as before",
              file=sys.stderr, flush=True)
        restart(before_switch)
    demo, handlers = build_app(config, runtime)
    print(f"[lminfinite-chat] {runtime.notice}; context budget {handlers.budget.tokens:,} tokens "
          f"({handlers.budget.why})", file=sys.stderr, flush=True)
    handlers.registry.start_sweeping()  # idle sessions are saved and freed on time, with or without traffic
    launch(config, demo, block=False)
    switching = serve_until_stopped(demo, handlers.model_switch)  # Ctrl-C, or another model from Settings
    saved = handlers.registry.save_all()
    temp_folders.remove_own()  # the sessions' exports
    handlers.registry.store.downloads.clear()  # and the links their downloads were served from
    print(f"[lminfinite-chat] stopped; saved {saved} workspace{'' if saved == 1 else 's'} changed since its last save",
          file=sys.stderr, flush=True)
    if switching:  # the same command and flags with the model asked for: same address and port (model_switch.py)
        restart(restart_argv(argv, handlers.model_switch.model), switched_from_argv=argv)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":  # required: ingest's PDF worker is a 'spawn' process that re-imports this module
    main()
