"""Read queries for the pages, a module per page: rollups first, never a scan of all steps for
totals.

Every selector takes the ids of the projects in scope and runs a fixed number of queries,
whatever the amount of data. Models are shown by family (`gpt-4o-2024-08-06`, `openai/gpt-4o`
and `gpt-4o` are one `gpt-4o`: costboard/pricing/families.py), each with its exact names.
"""
