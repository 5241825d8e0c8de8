"""The web layer: Gradio layout, wiring, event functions and views (see app/__init__)."""
