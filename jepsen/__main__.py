"""``python -m jepsen``: the same click group as the ``jepsen`` console script."""

from jepsen.cli import main

if __name__ == "__main__":
    main()
