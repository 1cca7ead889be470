"""``python -m mtpscope.demo.train``: :func:`mtpscope.demo.train.main`."""

from mtpscope.demo.train import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
