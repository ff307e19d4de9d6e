#!/usr/bin/env python
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "costboard.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except Exception as exc:
        # a database that does not answer, a setting refused: one line naming the fix
        from costboard.management.failures import failure_line

        line = failure_line(exc, sys.argv)
        if line is None:
            raise
        sys.stderr.write(line + "\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
