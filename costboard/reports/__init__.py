"""The showback report (docs/reports.md): per project, spend of a week or a month by a tag key,
by user and by model, each against the period before with its top movers — printed, emailed
(HTML, text and a CSV), posted to Slack, and shown at /reports/.

- spend.py: spend grouped and summed from the daily rollups — the one read behind both
  `GET /api/v1/spend` and the report, so their figures are the same numbers;
- periods.py: which week or month, in the project's budget timezone;
- selectors.py: the report of one project and period (reads only);
- messages.py: what the email, its CSV and the Slack message say;
- services.py: the sent-log and its deliveries through the outbox (the writes).
"""
