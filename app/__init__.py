"""The Gradio app: chat over one unbounded, append-only LM-Infinite context per browser session.

Three layers, from the model outwards; each imports only the ones before it:

- ``engine/``: the model and one session's context. ``model_loading`` / ``bundled_model`` pick and load the
  model; ``runtime`` is the shared model, and ``model_gate`` decides whose forward runs next; ``chat_format``
  turns any chat template into append-only token pieces; ``context`` is one session's context (cache, token
  spans, prefill / decode, snapshots and rollback) and yields typed progress and answer events; its helpers are
  ``generation`` (sampling), ``citations`` and ``spans`` (where recalled tokens came from), ``metrics`` and
  ``budget``. Knows nothing of sessions or the UI.
- ``session/``: one browser session's state and its work. ``state`` holds the chat, the documents table and
  the queued actions (``SessionRegistry`` holds them all); ``uploads`` reads uploads through ``ingest``;
  ``reading`` and ``model_work`` carry out an action's reading and model steps, turning engine events and errors
  into chat items; ``exporting`` writes Markdown and JSON. Never touches Gradio components.
- ``web/``: Gradio. ``handlers`` are the event functions, ``views`` turn session state into component values,
  ``ui`` is the layout, ``events`` wires the two, ``api`` is the one-call ``/ask`` reply, ``server`` builds
  and launches.

``cli`` declares every flag once, on ``AppConfig`` (``flags`` turns the fields into argparse).
"""
