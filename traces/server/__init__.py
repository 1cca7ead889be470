"""llama-server: building it from the llama.cpp mtpscope records with (``build``), starting it (``launch``),
talking to it (``client``), probing it into a request trace (``probe``) and replaying a probe with mtpscope's
recorder (``replay``). See docs/SERVER.md."""
