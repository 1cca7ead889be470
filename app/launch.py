"""The app's server process: ``mtpscope app`` runs ``python -m mtpscope.app.launch run app/main.py <flags>``, which
starts the warm-up (:func:`mtpscope.app.warmup.start`, on a thread) and then Streamlit's own command line with the
same arguments (``streamlit run …``), in this process: the pages find the caches the warm-up filled.

Imports: ``warmup``, streamlit's command line.
"""

from __future__ import annotations


def main() -> None:
    """Start the warm-up thread, then ``streamlit`` with this process's arguments (``run SCRIPT --flags``)."""
    from mtpscope.app import warmup

    warmup.start()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
