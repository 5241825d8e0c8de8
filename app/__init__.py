"""The Gradio app: chat over one unbounded, append-only LM-Infinite context per browser session.

Layers, from the model outwards (each file holds one idea):

- ``model_loading`` picks and loads the model; ``runtime`` is the shared model plus its device lock.
- ``chat_format`` turns the Llama-2 chat format into append-only token pieces.
- ``engine`` is one session's context: cache, token spans, prefill / decode, snapshots and rollback.
- ``generation``, ``citations``, ``metrics`` and ``budget`` are the engine's helpers.
- ``documents`` reads uploads through ``ingest``; ``sessions`` owns per-browser state.
- ``handlers`` are the event functions, ``views`` turn session state into component values,
  ``ui`` is the layout, ``events`` wires the two, ``server`` builds and launches; ``cli`` parses flags.

The UI layer (``handlers``, ``views``, ``ui``, ``events``) never touches tensors.
"""
