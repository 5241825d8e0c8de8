"""The engine layer: the shared model, and one session's LM-Infinite context with its events (see app/__init__)."""
