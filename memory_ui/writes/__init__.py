"""Every write of Memory, MemoryEvent, RetrievalLog and MemoryFeedback is in this package and
nowhere else (tests/memory_ui/test_writes.py scans for one): each function takes keyword
arguments, runs in its own transaction, locks the rows it decides on, and writes the
MemoryEvent of every change it makes (history.py) — whose `after` holds what changed, so
replaying a memory's events gives its status and content now. Nothing is approved without a
person.

- proposals: candidates proposed, and the lifecycle's evict/merge/compress proposals;
- decisions: edited, approved, rejected, expired (by a person or the TTL);
- retrievals: searches logged and feedback on them;
- imports: approved memories in bulk;
- history: the MemoryEvent row each of them writes.
"""
