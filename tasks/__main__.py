"""``python -m rescale_tasks``: the ``rescale`` command (:func:`rescale_tasks.cli.main`), for an
environment whose scripts folder is not on ``PATH``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
