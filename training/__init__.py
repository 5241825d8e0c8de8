"""Reproducible training of the small demo chat model shipped in ``demo_model/``.

The model is a tiny Llama trained on the Python standard library plus synthetic
long-context chat tasks, so the app and the tests have real weights without any
download.  Entry point: ``scripts/train_demo_model.py``.
"""
