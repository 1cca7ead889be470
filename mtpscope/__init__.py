"""mtpscope: glue shared by the CLI, the demo builder and the app (cache folders, real inputs).

One import root: the libraries are :mod:`mtpscope.inspector` (GGUF files), :mod:`mtpscope.traces` (MTP runs)
and :mod:`mtpscope.app` (the Streamlit app); their folders sit at the top of the repository (setuptools
package-dir), the error tree is :mod:`mtpscope.errors`.
"""

__version__ = "0.1.0"
