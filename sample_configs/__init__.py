"""Data package ``mtpscope.sample_configs``: published Hugging Face configs and the demo's recording config.

Installed with mtpscope (read through :mod:`importlib.resources`), so nothing needs a checkout.
"""
