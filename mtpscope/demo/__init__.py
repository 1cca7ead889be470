"""The built-in demo: its specification (``spec``, no numpy), builder, training and the trained pair."""
