#!/usr/bin/env python
"""Same as `mlxbatch convert ...`: see `mlxbatch convert --help`."""

import sys

from mlxbatch.cli import main

if __name__ == "__main__":
    sys.argv[1:1] = ["convert"]
    main()
