"""mtpscope: glue shared by the CLI, the demo builder and the app (cache folders, real inputs).

The libraries live in the import packages :mod:`inspector` (GGUF files) and :mod:`traces` (MTP runs).
"""

__version__ = "0.1.0"
