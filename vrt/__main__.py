"""``python -m vrt``: the same command line as the ``vrt`` console script."""

from vrt._cli import main

# Guarded so that importing every submodule (docs, API checks) does not run the CLI.
if __name__ == "__main__":
    raise SystemExit(main())
