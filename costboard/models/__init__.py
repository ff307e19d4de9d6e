"""Costboard's data, one module per domain; every name is imported from here
(`from costboard.models import Session`), whichever module defines it.

- fields: the columns the models share (USD amounts, rates, caps) and `usd`, money's JSON text
- projects: who reports and who sees (Project, ApiKey, Membership)
- pricing: what a token costs (ModelPrice) and negotiated rates (PriceAdjustment)
- usage: the three levels of usage, Session → Turn → Step
- rollups: what ingest keeps current beside the steps (the daily rollups, the model mix,
  latency histograms, the per-day tally of events)
- receipts: what makes a replay change nothing (EventReceipt, StepReceipt, IdempotentRequest)
- budgets: the default caps, period budgets and their ledgers, the budget events
- alerts: the outbox, and the webhooks and deliveries of budget alerts
- billing: what providers bill (BilledUsage) and their projects mapped to ours
- reports: the showback report's sent-log (SpendReportDelivery)
- anomalies: days whose spend rose far above their trailing 14 days (SpendAnomaly)

The modules import downwards in that order (fields first); none imports this package.
"""

from costboard.models.alerts import (
    ALERT_KINDS,
    AlertDelivery,
    OutboxItem,
    WebhookEndpoint,
    _alert_kinds,  # migrations 0007 and 0017 name it here as WebhookEndpoint.kinds' default
)
from costboard.models.anomalies import SpendAnomaly
from costboard.models.billing import BilledUsage, BillingDrift, ProviderProject
from costboard.models.budgets import (
    BudgetDay,
    BudgetEvent,
    BudgetHour,
    EnvironmentCaps,
    PeriodBudget,
    PeriodLedger,
)
from costboard.models.fields import cap_field, money_field, rate_field, usd
from costboard.models.pricing import (
    MAX_TIER_LENGTH,
    PRICE_EPOCH,
    STANDARD_TIER,
    TIER_PATTERN,
    TIER_WORD,
    ModelPrice,
    PriceAdjustment,
    service_tier_word,
)
from costboard.models.projects import ApiKey, Membership, Project
from costboard.models.receipts import EventReceipt, IdempotentRequest, StepReceipt
from costboard.models.reports import SpendReportDelivery
from costboard.models.rollups import (
    LATENCY_BUCKETS_PER_DECADE,
    DailyRollup,
    IngestTally,
    LatencyRollup,
    SessionModelUsage,
    TagDailyRollup,
    UserDailyRollup,
)
from costboard.models.usage import (
    CONTEXT_PRESSURE_AT,
    COST_FIELDS,
    SYSTEM_SESSION_ID,
    TOKEN_FIELDS,
    TOOL_MODEL,
    TOOL_STEP_TYPE,
    Session,
    Step,
    Turn,
    UsageTotals,
)

__all__ = [
    "ALERT_KINDS",
    "CONTEXT_PRESSURE_AT",
    "COST_FIELDS",
    "LATENCY_BUCKETS_PER_DECADE",
    "MAX_TIER_LENGTH",
    "PRICE_EPOCH",
    "STANDARD_TIER",
    "SYSTEM_SESSION_ID",
    "TIER_PATTERN",
    "TIER_WORD",
    "TOKEN_FIELDS",
    "TOOL_MODEL",
    "TOOL_STEP_TYPE",
    "AlertDelivery",
    "ApiKey",
    "BilledUsage",
    "BillingDrift",
    "BudgetDay",
    "BudgetEvent",
    "BudgetHour",
    "DailyRollup",
    "EnvironmentCaps",
    "EventReceipt",
    "IdempotentRequest",
    "IngestTally",
    "LatencyRollup",
    "Membership",
    "ModelPrice",
    "OutboxItem",
    "PeriodBudget",
    "PeriodLedger",
    "PriceAdjustment",
    "Project",
    "ProviderProject",
    "Session",
    "SessionModelUsage",
    "SpendAnomaly",
    "SpendReportDelivery",
    "Step",
    "StepReceipt",
    "TagDailyRollup",
    "Turn",
    "UsageTotals",
    "UserDailyRollup",
    "WebhookEndpoint",
    "_alert_kinds",
    "cap_field",
    "money_field",
    "rate_field",
    "service_tier_word",
    "usd",
]
