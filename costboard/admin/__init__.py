"""Costboard's admin, a module per domain as in costboard/models/: importing this package
(Django's admin autodiscovery does) registers every list.

- site: the site's titles, and ReadOnlyAdmin, the base of the lists nobody edits
- forms: the admin's forms and the decimal widgets the lists share
- pricing, projects, usage, alerts, budgets: the ModelAdmins of those models
"""

# each module registers its lists as it is imported
from costboard.admin import alerts, budgets, pricing, projects, site, usage  # noqa: F401
from costboard.lockout_admin import LoginLockoutAdmin  # noqa: F401  (axes' list, replaced)
