"""Costboard: LLM cost and agent-memory observability.

Kept free of imports so `costboard.client` works without Django or Celery configured; the
Celery app is loaded by CostboardConfig.ready().
"""
