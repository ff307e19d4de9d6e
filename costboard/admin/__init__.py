"""Costboard's admin, a module per domain as in costboard/models/: importing this package
(Django's admin autodiscovery does) registers every list.

- site: the site's titles, and ReadOnlyAdmin, the base of the lists nobody edits
- forms: the admin's forms and the decimal widgets the lists share
- pricing, projects, usage, alerts, budgets, billing, reports: the ModelAdmins of those
  models
- lockout: the login lockouts (axes' list, replaced)
"""

# each module registers its lists as it is imported
from costboard.admin import (  # noqa: F401
    alerts,
    billing,
    budgets,
    lockout,
    pricing,
    projects,
    reports,
    site,
    usage,
)
