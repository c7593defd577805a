"""``python -m gpusim`` is the same as the ``gpusim`` control CLI."""
import sys

from gpusim.cli import main

sys.exit(main())
