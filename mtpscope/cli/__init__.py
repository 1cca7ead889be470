"""The ``mtpscope`` command line: ``main.py`` registers one module per command group."""
