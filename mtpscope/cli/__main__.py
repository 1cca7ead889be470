"""``python -m mtpscope.cli``."""

from mtpscope.cli.main import main

if __name__ == "__main__":
    main()
