"""Speed and memory checks against named baselines (``make bench``). Each ``bench_*.py`` is a module run with
``python -m benchmarks.bench_NAME`` from the checkout's root (mtpscope itself comes from the installed package;
the checkout's root on ``sys.path`` only serves ``benchmarks`` and ``tests`` helpers). Targets are printed as
ratios against the baseline measured in the same run, never asserted."""
