"""`costboard.client`, as the server has always offered it: the `costboard-client` distribution.

    from costboard.client import BudgetExceeded, Costboard  # the same objects as costboard_client

The code lives in clients/python/ (`pip install ./clients/python`); `make install` installs it
beside the server. Like the client itself, this needs no Django settings.
"""

from __future__ import annotations

try:
    from costboard_client import BudgetExceeded, ClientStats, Costboard, Step, __version__
except ImportError as exc:  # the server does not depend on it: it is not on PyPI
    raise ImportError(
        "costboard.client needs the costboard-client distribution: run `make install`, or "
        "`pip install ./clients/python` from the Costboard checkout"
    ) from exc

__all__ = ["BudgetExceeded", "ClientStats", "Costboard", "Step", "__version__"]
