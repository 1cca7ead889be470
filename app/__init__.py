"""mtpscope's Streamlit app (``mtpscope app``): ``main.py`` routes to the pages in ``screens/``.

Only this package imports streamlit, and within it only ``main``, ``selection``, ``loaders``, ``guard``,
``url_state`` and the screens; ``charts``, ``views``, ``round_views``, ``model_views``, ``safety``, ``tokens``
and ``links`` are pure (tested without a Streamlit runtime; ``links`` imports only the standard library and
``mtpscope.errors``, so other commands build links to the app with it). The app sits on top:
it may import ``mtpscope.traces``, ``mtpscope.inspector``, ``mtpscope.cache``, ``mtpscope.demo.spec`` and
``mtpscope.errors``; nothing below imports it (tests/test_architecture.py).
"""
