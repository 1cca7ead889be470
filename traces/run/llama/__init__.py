"""llama.cpp through llama-cpp-python, one module per job (the only user of llama.cpp's C API in mtpscope).

* :mod:`.binding`: the one ``import llama_cpp`` (:func:`~.binding.llama`, lazily), the symbol checks, the
  ggml functions llama-cpp-python does not bind, the runtime facts for a trace manifest.
* :mod:`.logs`: llama.cpp's log, kept in memory (installed by :func:`~.binding.llama`).
* :mod:`.process`: the process around llama.cpp: a Ctrl-C during a decode, ggml's abort hook, what
  llama.cpp printed before it died.
* :mod:`.capture` (+ :mod:`.native_capture`, ``capture.c``): ``cb_eval`` graph capture, the
  ``struct ggml_tensor`` mirror.
* :mod:`.model`: models (full or vocab-only), contexts, batches, the sampler chain.

Nothing here imports ``llama_cpp`` at import time.
"""
