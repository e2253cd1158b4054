"""`python -m nanscope ...`: the same as the `nanscope` command."""

import sys

from nanscope.cli.main import main

sys.exit(main())
