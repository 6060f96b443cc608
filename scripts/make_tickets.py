#!/usr/bin/env python
"""Same as `mlxbatch tickets ...`: see `mlxbatch tickets --help`."""

import sys

from mlxbatch.cli import main

if __name__ == "__main__":
    sys.argv[1:1] = ["tickets"]
    main()
