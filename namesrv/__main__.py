"""``python -m namesrv``: the same as the ``namesrv`` console script."""

from namesrv.cli import main

main(prog_name="namesrv")
