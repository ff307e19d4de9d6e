"""costboard-client: report LLM usage to Costboard and stop before a session's budget is spent.

    from costboard_client import BudgetExceeded, Costboard

Standard library only; the code and its documentation are in `costboard_client._client`.
"""

from __future__ import annotations

from costboard_client._client import BudgetExceeded, ClientStats, Costboard, Step

__all__ = ["BudgetExceeded", "ClientStats", "Costboard", "Step", "__version__"]

__version__ = "0.8.0"
