"""The session layer: one browser session's chat, documents and queued work (see app/__init__)."""
