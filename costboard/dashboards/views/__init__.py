"""Server-rendered pages (docs/pages.md), a module per page or group of pages: login required,
scoped to the projects a user may see, filters in the URL, htmx swapping only the part that
changes."""
