"""The memory review queue in a real browser, as a member of the Reviewers group: approve,
edit (the counter counting as you type, a refusal in place, then save) and reject without a
reload; the keys j/k/a/e/r and Escape; Select all and Approve selected; then the memory
browser's MEMORY.md preview holds what was approved and edited and nothing rejected. No
JavaScript error on the way, and every asset from our own static files."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.utils import timezone
from playwright.sync_api import expect

from costboard.models import Membership
from memory_ui.cleaners import MemoryFields
from memory_ui.models import Memory, MemoryEvent
from memory_ui.writes import decisions, proposals
from tests.conftest import make_agent
from tests.e2e.test_dashboards_browser import log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

REFUSED = "the server responded with a status of 422"  # Chromium's note on a 422, expected

SENTENCES = [
    "Deploys to staging happen on Fridays",
    "Ann prefers short answers",
    "The office cat is named Pixel",
    "Releases are tagged with semantic versions",
    "Never page the on-call engineer for flaky tests",
    "The billing service lives in the payments repo",
    "Use UTC in every log line",
    "Dashboards are built with Grafana",
]


def reviewer(project: Any) -> Any:
    """A member of the project in the Reviewers group (not staff), who logs in as viewer."""
    user = get_user_model().objects.create_user("viewer", "", "pw-viewer-123")
    group, _ = Group.objects.get_or_create(name="Reviewers")  # a flush may have dropped it
    group.permissions.add(
        Permission.objects.get(content_type__app_label="memory_ui", codename="review_memory")
    )
    user.groups.add(group)
    Membership.objects.create(user=user, project=project)
    return user


def test_review_memories_in_chromium(live_server: Any, page: Any) -> None:
    agent = make_agent("acme")
    user = reviewer(agent.project)
    now = timezone.now()
    ids = []
    for i, sentence in enumerate(SENTENCES):  # the first is the newest
        memory = proposals.candidate_propose(
            project=agent.project,
            fields=MemoryFields.of(
                type="user" if i == 1 else "project",
                scope="user:ann" if i == 1 else "project",
                content=sentence,
            ),
            now=now - timedelta(minutes=i),
        )
        assert memory is not None
        ids.append(memory.pk)
    base = live_server.url
    assets: list[tuple[str, str]] = []
    page.on("request", lambda r: assets.append((r.resource_type, r.url)))

    log_in(page, base)
    page.click("nav >> text=Memory")
    page.wait_for_url(f"{base}/memory/review/")
    assert page.locator("article.candidate").count() == 8
    expect(page.locator("[data-count=all]")).to_have_text("8")
    page.evaluate("window.__kept = 'same page'")  # gone if the page reloads

    def row(index: int) -> Any:
        return page.locator(f"#candidate-{ids[index]}")

    def status(index: int) -> str:
        return Memory.objects.get(pk=ids[index]).status

    # Approve
    row(0).locator("button", has_text="Approve").click()
    page.wait_for_selector(f"#candidate-{ids[0]}[data-decided=approved]")
    assert "approved ✓" in row(0).text_content()
    expect(page.locator("[data-count=all]")).to_have_text("7")
    assert status(0) == "approved"

    # Edit: the counter counts as you type; a refusal in place; then save, which approves
    row(1).locator("button", has_text="Edit").click()
    textarea = row(1).locator("textarea[name=content]")
    textarea.wait_for()
    # the form focuses its text after htmx settles the swap: wait for it, as later steps do
    page.wait_for_function("document.activeElement.name === 'content'", timeout=5000)
    assert page.evaluate("document.activeElement.name") == "content"
    counter = row(1).locator("output.counter")
    expect(counter).to_have_text(f"{len(SENTENCES[1])}/150")
    textarea.fill("")
    textarea.press_sequentially("Ann likes")
    expect(counter).to_have_text("9/150")
    textarea.press_sequentially(" short answers, in French")
    expect(counter).to_have_text("34/150")
    textarea.fill("x" * 151)
    expect(counter).to_have_text("151/150")
    assert "over" in counter.get_attribute("class")
    row(1).locator("input[name=tags]").fill("tone, language")
    row(1).locator("button", has_text="Save and approve").click()
    page.wait_for_selector(f"#candidate-{ids[1]} [data-error=content]")
    assert "Content: is 151 characters; at most 150" in row(1).text_content()
    assert row(1).locator("input[name=tags]").input_value() == "tone, language"
    assert status(1) == "pending"
    row(1).locator("textarea[name=content]").fill("Ann likes short answers, in French")
    expect(row(1).locator("output.counter")).to_have_text("34/150")
    row(1).locator("button", has_text="Save and approve").click()
    page.wait_for_selector(f"#candidate-{ids[1]}[data-decided=approved]")
    edited = Memory.objects.get(pk=ids[1])
    assert (edited.status, edited.content, edited.tags) == (
        "approved",
        "Ann likes short answers, in French",
        ["tone", "language"],
    )

    # Reject
    row(2).locator("button", has_text="Reject").click()
    page.wait_for_selector(f"#candidate-{ids[2]}[data-decided=rejected]")
    assert status(2) == "rejected"
    assert page.evaluate("window.__kept") == "same page"

    # Keys: j/k move the focus (a visible ring, scrolled into view), a approves, r rejects
    page.locator("h1").click()  # nothing focused
    page.keyboard.press("j")
    assert page.evaluate("document.activeElement.id") == f"candidate-{ids[3]}"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.evaluate("document.activeElement.id") == f"candidate-{ids[5]}"
    page.keyboard.press("k")
    page.keyboard.press("k")
    assert page.evaluate("document.activeElement.id") == f"candidate-{ids[3]}"
    in_view = (
        "(() => { const r = document.activeElement.getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; })()"
    )
    assert page.evaluate(in_view)
    page.keyboard.press("a")
    page.wait_for_selector(f"#candidate-{ids[3]}[data-decided=approved]")
    page.wait_for_function(f"document.activeElement.id === 'candidate-{ids[4]}'")
    page.keyboard.press("r")
    page.wait_for_selector(f"#candidate-{ids[4]}[data-decided=rejected]")
    page.wait_for_function(f"document.activeElement.id === 'candidate-{ids[5]}'")
    assert (status(3), status(4)) == ("approved", "rejected")

    # e opens the edit form; keys typed there are text, not commands; Escape cancels
    page.keyboard.press("e")
    page.wait_for_selector(f"#candidate-{ids[5]} textarea[name=content]")
    page.wait_for_function("document.activeElement.name === 'content'")
    page.keyboard.type(" ar")
    expect(row(5).locator("output.counter")).to_have_text(f"{len(SENTENCES[5]) + 3}/150")
    assert status(5) == "pending"
    page.keyboard.press("Escape")
    page.wait_for_selector(f"#candidate-{ids[5]} button[data-action=approve]")
    page.wait_for_function(f"document.activeElement.id === 'candidate-{ids[5]}'")
    assert Memory.objects.get(pk=ids[5]).content == SENTENCES[5]

    # Select all, then Approve selected: the list comes back without them
    page.check("#select-all")
    expect(page.locator("[data-selected-count]")).to_have_text("3 selected")
    page.locator("button", has_text="Approve selected").click()
    page.wait_for_selector("[data-note]")
    assert "Approved 3 candidates." in page.text_content("[data-note]")
    assert page.locator("article.candidate").count() == 0
    expect(page.locator("[data-count=all]")).to_have_text("0")
    assert [status(i) for i in range(8)] == [
        "approved",
        "approved",
        "rejected",
        "approved",
        "rejected",
        "approved",
        "approved",
        "approved",
    ]
    assert page.evaluate("window.__kept") == "same page"
    decisions = MemoryEvent.objects.filter(action__in=["approved", "rejected", "edited"])
    assert {e.actor_id for e in decisions} == {user.pk}

    # MEMORY.md: what was approved and edited, nothing rejected
    page.click("nav.memory-tabs >> text=Memories")
    page.wait_for_url(f"{base}/memory/")
    preview = page.text_content("section[data-scope=project] [data-md]")
    assert "[project] Deploys to staging happen on Fridays" in preview
    assert "[project] Dashboards are built with Grafana" in preview
    assert "Pixel" not in preview and "on-call" not in preview
    assert page.get_attribute("section[data-scope=project] [data-md-lines]", "data-md-lines") == "5"
    user_md = page.text_content("section[data-scope='user:ann'] [data-md]")
    assert user_md == "[user] Ann likes short answers, in French\n"
    assert "Ann prefers short answers" not in page.content()
    # ...the same text the agent reads (docs/memory.md, "MEMORY.md")
    for scope, shown in (("project", preview), ("user:ann", user_md)):
        served = agent.client.get(
            "/api/v1/memory/MEMORY.md",
            {"scope": scope},
            headers={"Authorization": f"Bearer {agent.key}"},
        )
        assert served.status_code == 200
        assert served.content.decode() == shown

    # the one refused save, and nothing else
    assert [e for e in page.errors if REFUSED in e] == [page.errors[0]]
    assert [e for e in page.errors if REFUSED not in e] == []
    origin = urlsplit(base).netloc
    assert {urlsplit(url).netloc for _, url in assets} == {origin}
    fetched = [(kind, url) for kind, url in assets if kind not in {"document", "xhr", "fetch"}]
    assert {kind for kind, _ in fetched} >= {"script", "stylesheet"}
    assert any(url.endswith("/static/costboard/review.js") for _, url in fetched)
    for kind, url in fetched:
        assert urlsplit(url).path.startswith("/static/"), (kind, url)


def test_a_contradiction_side_by_side_and_superseded_in_chromium(
    live_server: Any, page: Any
) -> None:
    """A correction of an approved memory waits beside it, the words that differ marked; the
    similar approved memories load as the card shows; Approve supersedes the old one: gone
    from MEMORY.md, kept in its history."""
    agent = make_agent("acme")
    reviewer(agent.project)
    old = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="The staging database runs on port 5432"),
    )
    assert old is not None
    decisions.memory_approve(old, by=None)
    kin = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="The staging database is backed up nightly"),
    )
    assert kin is not None
    decisions.memory_approve(kin, by=None)
    new = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="The staging database runs on port 5433"),
    )
    assert new is not None and list(new.conflicts_with.all()) == [old]
    base = live_server.url

    log_in(page, base)
    page.goto(f"{base}/memory/review/")
    card = page.locator(f"#candidate-{new.pk}")
    side = card.locator("[data-conflicts]")
    expect(side.locator("[data-conflict-new] mark.differs")).to_have_text("5433")
    expect(side.locator(f"[data-conflict-with='{old.pk}'] mark.differs")).to_have_text("5432")
    expect(side.locator("[data-conflict-why]")).to_have_text("differs in a number, date or version")
    # the aside, fetched when the card came into view: the old fact and its kin
    expect(card.locator(f"[data-similar-to='{old.pk}']")).to_be_visible()
    expect(card.locator(f"[data-similar-to='{kin.pk}']")).to_be_visible()
    page.evaluate("window.__kept = 'same page'")
    card.locator("[data-action=approve]").click()
    expect(page.locator(f"#candidate-{new.pk}[data-decided=approved]")).to_be_visible()
    assert page.evaluate("window.__kept") == "same page"

    page.goto(f"{base}/memory/")
    preview = page.text_content("section[data-scope=project] [data-md]")
    assert "port 5433" in preview and "port 5432" not in preview
    page.goto(f"{base}/memory/{old.pk}/")
    expect(page.locator("[data-status]")).to_have_text("superseded")
    expect(page.locator("[data-superseded-by]")).to_have_text(f"memory {new.pk}")
    expect(page.locator("tr[data-event=superseded] [data-actor]")).to_have_text("viewer")
    assert page.errors == []


def test_a_pasted_secret_is_redacted_and_a_second_reviewer_is_told(
    live_server: Any, page: Any, browser: Any
) -> None:
    """docs/memory.md, "Redaction" and "Review and permissions": a key pasted into an edit is
    stored redacted and the reviewer sees so in the row; two reviewers on one candidate, the
    second is told who decided first, in place, without a reload."""
    agent = make_agent("acme")
    reviewer(agent.project)
    other = get_user_model().objects.create_user("second", "", "pw-second-123")
    other.groups.add(Group.objects.get(name="Reviewers"))
    Membership.objects.create(user=other, project=agent.project)
    key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH"
    made = [
        proposals.candidate_propose(
            project=agent.project, fields=MemoryFields.of(type="project", content=sentence)
        )
        for sentence in ("Deploys use the staging key", "Releases are tagged with versions")
    ]
    secret, contested = (m.pk for m in made if m is not None)
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/memory/review/")
    row = page.locator(f"#candidate-{secret}")
    row.locator("button", has_text="Edit").click()
    # review.js puts the caret at the end once htmx settles the swap: a fill before that
    # would have its text appended to the old (wait for it, as the queue's test does)
    expect(row.locator("textarea[name=content]")).to_be_focused()
    row.locator("textarea[name=content]").fill(f"Deploys use the key {key}")
    row.locator("button", has_text="Save without approving").click()
    notice = page.locator(f"#candidate-{secret} [data-redacted-now]")
    expect(notice).to_have_text(
        "Redacted before saving: api_key. A secret does not belong in a memory: every agent "
        "reads it."
    )
    expect(page.locator(f"#candidate-{secret} [data-content]")).to_have_text(
        "Deploys use the key [redacted:api_key]"
    )
    assert key not in page.content()
    assert Memory.objects.get(pk=secret).content == "Deploys use the key [redacted:api_key]"

    # the second reviewer has the queue open too; the first approves, then the second rejects
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    second = context.new_page()
    second.set_default_timeout(15_000)
    second.goto(f"{base}/accounts/login/")
    second.fill("input[name=username]", "second")
    second.fill("input[name=password]", "pw-second-123")
    second.click("button[type=submit]")
    second.goto(f"{base}/memory/review/")
    second.locator(f"#candidate-{contested}").wait_for()
    page.locator(f"#candidate-{contested} button", has_text="Approve").click()
    page.wait_for_selector(f"#candidate-{contested}[data-decided=approved]")
    second.locator(f"#candidate-{contested} button", has_text="Reject").click()
    expect(second.locator(f"#candidate-{contested} [data-lost]")).to_have_text(
        "Your reject was not applied: viewer approved it first."
    )
    context.close()
    assert Memory.objects.get(pk=contested).status == "approved"
    assert page.errors == []
