"""A labelled corpus for memory detection: realistic agent chat from support, coding and research
conversations, each message with the memory type it should yield (or None), and for secrets
and personal data the exact strings that must never reach a candidate.

Every message holds at most one memory, so a message is one labelled example. All keys,
tokens, passwords, cards and addresses below are made up (test values or random strings).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

USER, FEEDBACK, PROJECT, REFERENCE = "user", "feedback", "project", "reference"


@dataclass(frozen=True)
class Sample:
    text: str  # the user's message
    expected: str | None  # the memory type it should yield, None for nothing
    assistant: str = ""  # the assistant's reply, when the memory is in it
    source: str = "user_stated"  # where the expected memory comes from
    secrets: tuple[str, ...] = ()  # strings no candidate may contain
    redactions: tuple[str, ...] = ()  # the kinds redact(text) must report
    domain: str = ""  # support, coding, research


def _s(text: str, expected: str | None, **fields: object) -> Sample:
    return Sample(text, expected, **fields)  # type: ignore[arg-type]


PREFERENCES = [
    _s("I prefer concise answers, no more than three bullet points.", USER, domain="support"),
    _s("I'm a backend engineer and I mostly write Python 3.12.", USER, domain="coding"),
    _s("Personally I'd rather see code examples than long explanations.", USER, domain="coding"),
    _s("I like my SQL formatted with uppercase keywords.", USER, domain="coding"),
    _s("My timezone is CET, so 9am for me is 3am in New York.", USER, domain="support"),
    _s("I hate it when answers start by repeating my question.", USER, domain="support"),
    _s("I work on the payments team at Acme, mostly on refunds.", USER, domain="support"),
    _s("I want answers in British English, please.", USER, domain="support"),
    _s("I'm new to Kubernetes, so explain the basics when they come up.", USER, domain="coding"),
    _s("Hi! I'm a data scientist and I use R and pandas every day.", USER, domain="research"),
    _s("For code reviews I prefer short inline comments over one long summary.", USER),
    _s("I read your answers on my phone, so short paragraphs work best for me.", USER),
    _s("My role is tech lead for the mobile apps.", USER, domain="coding"),
    _s("I'd like explanations to include the trade-offs, not just the answer.", USER),
    _s("Honestly I love tables for comparisons, they're much easier to scan.", USER),
    _s("I'm a PhD student in computational biology, so skip the intro material.", USER),
    _s("I'm a product manager, not an engineer, so avoid jargon.", USER),
    _s("I'd prefer if you used numbered steps for instructions.", USER),
    _s("I really don't like emojis in responses.", USER, domain="support"),
    _s("My preferred language for examples is TypeScript.", USER, domain="coding"),
    _s("I'm based in Singapore.", USER),
    _s("I love it when you include links to the sources.", USER, domain="research"),
    _s("I need the answers to be in plain text, no markdown.", USER),
    _s("As a nurse I don't have much time, so keep it short.", USER, domain="support"),
    _s("I'd love it if you kept the code comments minimal.", USER, domain="coding"),
    _s("I mainly use VS Code with the Vim extension.", USER, domain="coding"),
    _s("I find long answers hard to follow.", USER),
    _s("I'm left-handed, which matters for the ergonomic keyboard recommendation.", USER),
    _s("I tend to prefer pragmatic solutions over clever ones.", USER, domain="coding"),
    _s("I use Arch, by the way.", USER, domain="coding"),
    _s("I don't like long intros in emails.", USER, domain="support"),
    _s("I'm vegetarian, keep that in mind for restaurant suggestions.", USER),
    _s("I'm Sam, I run the support team here.", USER, domain="support"),
    _s("I usually prefer dark mode screenshots in docs.", USER),
    _s("The production database is db-prod-1.eu-west-1.rds.amazonaws.com.", REFERENCE),
    _s("You can find the OpenAPI spec at /api/v1/openapi.json.", REFERENCE, domain="coding"),
    _s("Metrics are in Datadog under the 'checkout' dashboard.", REFERENCE, domain="coding"),
    _s("Our internal PyPI mirror is at https://pypi.acme.internal/simple.", REFERENCE),
    _s("The shared drive folder for the study is 'Research/2024/Trials'.", REFERENCE),
    _s("MinIO runs on port 9000 locally.", REFERENCE, domain="coding"),
    _s("The design files are in Figma, in the 'Checkout v3' project.", REFERENCE),
    _s("Customer escalations go to #support-escalations.", REFERENCE, domain="support"),
    _s("The status page is status.acme.com.", REFERENCE, domain="support"),
    _s("The knowledge base article on refunds is KB-1042.", REFERENCE, domain="support"),
    _s("The Terraform state is stored in s3://acme-tf-state/prod.", REFERENCE, domain="coding"),
    _s("Logs are shipped to Loki at loki.monitoring.svc:3100.", REFERENCE, domain="coding"),
    _s("The onboarding checklist lives in the team wiki.", REFERENCE),
    _s("Jenkins is at ci.acme.io, login with SSO.", REFERENCE, domain="coding"),
    _s("Our Postgres replica listens on 5434.", REFERENCE, domain="coding"),
    _s("The pricing page copy is in the marketing repo under content/pricing.md.", REFERENCE),
    _s("The study protocol is documented at osf.io/abc12.", REFERENCE, domain="research"),
    _s("The staging environment is at https://staging.acme.app.", REFERENCE),
    _s("The team's on-call schedule is in PagerDuty.", REFERENCE, domain="support"),
    _s("Our main repo is gitlab.com/acme/platform.", REFERENCE, domain="coding"),
    _s("Kafka brokers are at kafka-1:9092 and kafka-2:9092.", REFERENCE, domain="coding"),
    _s("btw the Jira board for this is at acme.atlassian.net/jira/PAY.", REFERENCE),
    _s(
        "The paper we're replicating is Vaswani et al. 2017, the code is on GitHub.",
        REFERENCE,
        domain="research",
    ),
    _s(
        "Thanks! Also note that the analytics warehouse is BigQuery, project acme-analytics.",
        REFERENCE,
    ),
    _s("I'm colour-blind, so please don't use red/green to show status.", USER),
    _s("I'd rather you asked before running destructive commands.", USER, domain="coding"),
    _s("I like short variable names in throwaway scripts.", USER, domain="coding"),
    _s("Remember that I can't install anything without admin rights.", USER),
    _s("I've been a Java developer for 10 years, Python is new to me.", USER),
    _s("Our Slack workspace is acme-hq.slack.com.", REFERENCE),
    _s("Prod Postgres is on 5432, the read replica on 5433.", REFERENCE, domain="coding"),
    _s("The model card is at huggingface.co/acme/llama-ft-7b.", REFERENCE, domain="research"),
    _s("The logs for the worker are in /var/log/celery/worker.log.", REFERENCE),
    _s(
        "Hey, quick one. I prefer answers with the command first and the explanation after.",
        USER,
        domain="coding",
    ),
    _s("I'm a freelance translator working mostly from Spanish into English.", USER),
    _s("I like Go for services and Python for scripts.", USER, domain="coding"),
    _s("I hate meetings before 10am, so don't schedule anything then.", USER),
    _s("I work in healthcare, so HIPAA matters for anything you suggest.", USER),
    _s("I'm allergic to peanuts.", USER),
    _s("The Figma file is linked in the README.", REFERENCE),
    _s("The ML team owns the feature store; their channel is #ml-platform.", REFERENCE),
    _s("The VPN config is on the intranet at intranet.acme.local/vpn.", REFERENCE),
    _s("No, that's wrong: the qa auth database is on port 5001.", REFERENCE, domain="coding"),
]

FEEDBACK_RULES = [
    _s("Always use ruff for linting, never black.", FEEDBACK, domain="coding"),
    _s("No, don't use anyio here, we use pytest-asyncio.", FEEDBACK, domain="coding"),
    _s("From now on, write commit messages in the imperative mood.", FEEDBACK, domain="coding"),
    _s("Never commit directly to main; open a pull request instead.", FEEDBACK, domain="coding"),
    _s("Please stop adding docstrings to private helpers.", FEEDBACK, domain="coding"),
    _s("That's wrong: the refund window is 14 days, not 30.", FEEDBACK, domain="support"),
    _s("Make sure every new endpoint has a test before you open the PR.", FEEDBACK),
    _s("Use httpx instead of requests in all new code.", FEEDBACK, domain="coding"),
    _s("You should always cite the source document when you quote a policy.", FEEDBACK),
    _s("Don't apologize so much in replies to customers.", FEEDBACK, domain="support"),
    _s("Prefer composition over inheritance in this codebase.", FEEDBACK, domain="coding"),
    _s("Remember to run the migrations before the integration tests.", FEEDBACK),
    _s("Going forward, answer customer emails in a friendly but formal tone.", FEEDBACK),
    _s("Stop using print statements for debugging, use the logger.", FEEDBACK),
    _s(
        "Yes, that's exactly right, keep using the repository pattern for data access.",
        FEEDBACK,
        domain="coding",
    ),
    _s("Actually, we never round prices in quotes; show two decimals.", FEEDBACK),
    _s(
        "When you summarize papers, always list the sample size first.", FEEDBACK, domain="research"
    ),
    _s("Keep answers under 200 words unless I ask for detail.", FEEDBACK),
    _s("Do not use semicolons in JavaScript.", FEEDBACK, domain="coding"),
    _s("Never suggest rebooting as a first step to customers.", FEEDBACK, domain="support"),
    _s("You keep using var; please use const or let instead.", FEEDBACK, domain="coding"),
    _s("We always squash-merge pull requests.", FEEDBACK, domain="coding"),
    _s("Wrong, the API returns 404 for missing users, not 400.", FEEDBACK, domain="coding"),
    _s("In every reply to a customer, include the ticket number.", FEEDBACK, domain="support"),
    _s("Don't mock the database in integration tests.", FEEDBACK, domain="coding"),
    _s("Please always add type hints to function signatures.", FEEDBACK, domain="coding"),
    _s("That's not what I asked; I wanted the median, not the mean.", FEEDBACK),
    _s("Avoid passive voice in the abstract.", FEEDBACK, domain="research"),
    _s("Only use the official SDK to call the payments API.", FEEDBACK, domain="coding"),
    _s("Please address me as Dr. Patel in emails you draft.", FEEDBACK, domain="support"),
    _s("Stop suggesting Docker, we can't use it on these machines.", FEEDBACK),
    _s("Use British spelling in all customer-facing copy.", FEEDBACK, domain="support"),
    _s("Whenever a test fails, show me the full traceback.", FEEDBACK, domain="coding"),
    _s("No, the cron runs at 02:00 UTC, not midnight.", FEEDBACK, domain="coding"),
    _s("Please don't reformat files you didn't change.", FEEDBACK, domain="coding"),
    _s("Good catch, and yes, always pin dependency versions.", FEEDBACK, domain="coding"),
    _s("Never promise refunds before the manager approves them.", FEEDBACK, domain="support"),
    _s("Could you always answer in Spanish from now on?", FEEDBACK),
    _s("Always respond in the same language the customer wrote in.", FEEDBACK),
    _s("Don't use abbreviations in customer replies.", FEEDBACK, domain="support"),
    _s("Use UTC for every timestamp you show me.", FEEDBACK, domain="coding"),
    _s("In code samples, never include real customer data.", FEEDBACK, domain="coding"),
    _s("Hmm no, that's not right. The discount only applies to annual plans.", FEEDBACK),
    _s("Ugh, again? Please never restart the prod workers without asking me first.", FEEDBACK),
    _s("Answer in bullet points from now on.", FEEDBACK),
    _s("I asked for Python, not JavaScript!", FEEDBACK, domain="coding"),
    _s("Use four spaces, never tabs.", FEEDBACK, domain="coding"),
    _s("Please keep PR descriptions short, two or three sentences max.", FEEDBACK),
    _s("Never use the word 'unfortunately' in support replies.", FEEDBACK, domain="support"),
    _s("Please use the metric system in every answer.", FEEDBACK),
    _s("Use the staging bucket for test uploads, never prod.", FEEDBACK, domain="coding"),
    _s("Ok so from now on, put the TL;DR at the top of every answer.", FEEDBACK),
    _s("Nope. We don't support IE11 anymore.", FEEDBACK, domain="support"),
    _s("Don't ever push to the release branch on Fridays.", FEEDBACK, domain="coding"),
    _s("Keep the changelog in CHANGELOG.md updated with every release.", FEEDBACK),
    _s("Use American English, not British, for the marketing site.", FEEDBACK),
    _s(
        "We use pytest for linting and terraform for formatting in this repo; keep it that way.",
        FEEDBACK,
        domain="coding",
    ),
]

PROJECT_FACTS = [
    _s("The deadline for the v2.1 release is Friday, March 14.", PROJECT, domain="coding"),
    _s("We're migrating the billing service from Flask to Django this quarter.", PROJECT),
    _s("The customer demo is next Tuesday at 10am.", PROJECT, domain="support"),
    _s("We're shipping the new onboarding flow by the end of the month.", PROJECT),
    _s("Code freeze starts on June 3rd.", PROJECT, domain="coding"),
    _s("Our backend runs on PostgreSQL 16 and Celery with Redis.", PROJECT, domain="coding"),
    _s("I'm working on the search relevance experiment this sprint.", PROJECT, domain="research"),
    _s("The Q3 report is due on September 30.", PROJECT, domain="research"),
    _s("We are rewriting the mobile app in React Native, about halfway done.", PROJECT),
    _s("Important: the launch moved to April 2, so plan the docs update around that.", PROJECT),
    _s("The client wants the first draft of the literature review by 15 May.", PROJECT),
    _s("Our team is blocked on the SSO integration until legal signs off.", PROJECT),
    _s("We deploy to Fly.io in the ord region.", PROJECT, domain="coding"),
    _s("The grant application is due in 3 weeks, on the 28th.", PROJECT, domain="research"),
    _s("The beta launches on the 1st of July.", PROJECT),
    _s("We have until Thursday to finish the security review.", PROJECT, domain="coding"),
    _s("We're currently upgrading from Django 4.2 to 5.2.", PROJECT, domain="coding"),
    _s("The board meeting is on Nov 12 and they want the churn analysis.", PROJECT),
    _s("Our SLA for enterprise tickets is 4 hours.", PROJECT, domain="support"),
    _s("The migration to Kafka is on hold until next quarter.", PROJECT, domain="coding"),
    _s("Submission deadline for NeurIPS is May 22.", PROJECT, domain="research"),
    _s("I'm preparing the quarterly business review for Acme Corp.", PROJECT),
    _s("The app targets iOS 16 and Android 12 and up.", PROJECT, domain="coding"),
    _s("We're waiting on the vendor to fix the webhook bug.", PROJECT, domain="support"),
    _s("Our customers are mostly small bakeries in the Midwest.", PROJECT, domain="support"),
    _s("The investor update goes out on the first Monday of every month.", PROJECT),
    _s("We're aiming to publish the preprint by late August.", PROJECT, domain="research"),
    _s("The v3 API will be deprecated on 2025-01-31.", PROJECT, domain="coding"),
    _s("Right now I'm debugging the flaky checkout test.", PROJECT, domain="coding"),
    _s("Our goal this quarter is to cut p95 latency below 300ms.", PROJECT, domain="coding"),
    _s("We release every other Wednesday.", PROJECT, domain="coding"),
    _s("The conference talk is on October 8th.", PROJECT, domain="research"),
    _s("We're building a recommendation engine for the bookstore app.", PROJECT),
    _s("The thesis is due on June 30th.", PROJECT, domain="research"),
    _s("Quick heads up: our fiscal year ends on June 30, so Q4 numbers matter.", PROJECT),
    _s("We'll present the findings at the lab meeting on Thursday.", PROJECT, domain="research"),
    _s("For tests, we use pytest with the django plugin and factory_boy.", PROJECT),
    _s("We're switching from Jenkins to GitHub Actions next month.", PROJECT, domain="coding"),
    _s("We're a three-person startup selling handmade soap online.", PROJECT),
    _s("The holiday freeze begins December 15.", PROJECT),
    _s("The renewal for the Acme contract is due March 31.", PROJECT, domain="support"),
    _s(
        "Reviewer 2 wants more ablations before the camera-ready deadline on Aug 20.",
        PROJECT,
        domain="research",
    ),
    _s("The API rate limit is 100 requests per minute per key.", PROJECT, domain="coding"),
    _s("We're on version 2.14.3 of the SDK.", PROJECT, domain="coding"),
    _s(
        "Morning! The release train leaves Thursday at noon, so let's wrap up the PR today.",
        PROJECT,
        domain="coding",
    ),
    _s("Our sprint ends on the 14th and demo day is the 15th.", PROJECT, domain="coding"),
    _s("We're replacing Elasticsearch with OpenSearch over the next two sprints.", PROJECT),
    _s("Remember that Jules owns logging and must review every change to it.", PROJECT),
    _s("Priya is responsible for the payments on-call rota.", PROJECT, domain="support"),
]

REFERENCES = [
    _s("The staging DB is on port 5433.", REFERENCE, domain="coding"),
    _s("API docs are at https://internal.acme.dev/api/v3.", REFERENCE, domain="coding"),
    _s("The incident runbook lives in Confluence under SRE/Runbooks.", REFERENCE),
    _s("Grafana dashboards are at grafana.acme.internal.", REFERENCE, domain="coding"),
    _s("Our Redis cache is at cache-01.prod.acme.internal:6379.", REFERENCE, domain="coding"),
    _s("The style guide is in docs/STYLE.md in the main repo.", REFERENCE, domain="coding"),
    _s("Deploy notices go to the #release-train Slack channel.", REFERENCE),
    _s("The eval dataset is on Hugging Face at hf.co/datasets/acme/eval-v2.", REFERENCE),
    _s("Sentry for the web app: https://sentry.io/organizations/acme/projects/web/", REFERENCE),
    _s("The VPN gateway is 10.20.0.1 and the bastion is bastion.acme.net.", REFERENCE),
    _s("Note that the support knowledge base is at help.acme.com/kb.", REFERENCE),
    _s("For refund questions, check the Notion page 'Refunds 2024'.", REFERENCE),
    _s("The paper's code is at github.com/acme-research/sparse-attn.", REFERENCE),
    _s("The local dev server runs on localhost:8000.", REFERENCE, domain="coding"),
]

SMALL_TALK = [
    _s("thanks!", None),
    _s("hi", None),
    _s("ok cool", None),
    _s("lol", None),
    _s("how are you?", None),
    _s("Thanks, that works perfectly.", None),
    _s("Good morning!", None),
    _s("lgtm, ship it", None),
    _s("haha nice one", None),
    _s("Perfect, thank you so much!", None),
    _s("ok thanks, bye", None),
    _s("Nice, that worked!", None),
    _s("Sorry, my bad.", None),
    _s("hello there", None),
    _s("yep", None),
    _s("thank you!! that fixed it", None),
    _s("sounds good to me", None),
    _s("oh wow", None),
    _s("Never mind, I figured it out.", None),
    _s("Don't worry about it.", None),
    _s("Always happy to help!", None),
    _s("I'm fine, thanks.", None),
    _s("I'm going to lunch.", None),
    _s("My bad, wrong file.", None),
    _s("You're right, thanks.", None),
    _s("Cool cool cool", None),
    _s("Thanks for the help earlier!", None),
    _s("That's perfect, exactly what I needed.", None),
    _s("Good night!", None),
]

QUESTIONS = [
    _s("What's the deadline for the v2 release?", None),
    _s("Can you explain how Celery retries work?", None),
    _s("Where are the API docs?", None),
    _s("Is port 5433 open on staging?", None),
    _s("Why does the test fail on PostgreSQL only?", None),
    _s("Do you always use ruff?", None),
    _s("How do I reset my password?", None),
    _s("Would it be better to use httpx instead of requests here?", None),
    _s("Which model should I use for embeddings?", None),
    _s("What do you think?", None),
    _s("Any idea why the build is slow?", None),
    _s("Can you check if the invoice was sent?", None),
    _s("Remember when we fixed that bug last year?", None),
    _s("Is the release on Friday?", None),
    _s("Hey! Can you draft a reply to this customer? They want a refund.", None),
    _s("Can you explain that again, but simpler?", None),
    _s("What time zone are you using?", None),
    _s("Could you also double-check the numbers? Thanks.", None),
    _s("Can you make it more formal?", None),
    _s("Why is the CI red?", None),
]

ONE_OFF = [
    _s("Just this once, skip the type hints.", None),
    _s("For now, use the mock payment server.", None),
    _s("This time answer in French, please.", None),
    _s("Temporarily disable the flaky test so I can merge.", None),
    _s("Write a function that parses ISO dates.", None),
    _s("Summarize this thread in three bullets.", None),
    _s("Translate the following email into German.", None),
    _s("Use a smaller font for this chart.", None),
    _s("Send the customer a refund link.", None),
    _s("Could you make the chart blue?", None),
    _s("Please fix the typo in line 12.", None),
    _s("Give me three title ideas for the blog post.", None),
    _s("Rename the variable to user_count.", None),
    _s("Make the button red.", None),
    _s("Delete the old branch.", None),
    _s("Run the tests again.", None),
    _s("Just for today, skip the standup summary.", None),
    _s("Please use a table for this comparison.", None),
    _s("Make it shorter.", None),
    _s("Make sure the email sounds polite.", None),
    _s("I want to understand how the refund flow works.", None),
    _s("I need a regex that matches UK postcodes.", None),
    _s("Please write the summary in German.", None),
    _s("Don't summarize the whole paper, just the methods section.", None),
    _s("Try again with a lower temperature.", None),
    _s("Generate 5 test cases for the parser.", None),
    _s("Write it as a haiku this time.", None),
    _s("Your last answer was too long, shorter please.", None),
    _s("Please reply in Portuguese for this customer.", None),
]

VAGUE = [
    _s("That's interesting.", None),
    _s("I'm not sure this is right.", None),
    _s("The code looks fine to me.", None),
    _s("It works now.", None),
    _s("Hmm, let me think about it.", None),
    _s("That makes sense, I guess.", None),
    _s("The results were a bit noisy.", None),
    _s("Yesterday was a long day.", None),
    _s("I like that idea.", None),
    _s("Let's try a different approach.", None),
    _s("I think the bug is in the parser.", None),
    _s("This is taking forever.", None),
    _s("Interesting, I didn't know that.", None),
    _s("The weather is nice today.", None),
    _s("I guess it's fine.", None),
    _s("The meeting went well.", None),
    _s("That's a lot of code.", None),
    _s("I was thinking about this last night.", None),
    _s("fyi I'm on the night shift, so I'll usually ping you around 2am", None),
    _s("We just hired two contractors for the data labeling work.", None),
    _s("See RFC 7231 section 6.5 for the status code semantics.", None),
    _s("I always forget how rebase works.", None),
    _s("It never works on the first try.", None),
    _s("I like this version better.", None),
    _s("The deadline was yesterday, ugh.", None),
    _s("I prefer the second option.", None),
    _s("The docs are confusing.", None),
    _s("The server crashed again.", None),
    _s("Our tests are slow.", None),
    _s("We discussed this in the meeting.", None),
    _s("Note that the endpoint returned a 500.", None),
    _s("The API is down.", None),
    _s("Customer says the app crashes on login.", None),
    _s("Release notes look good.", None),
    _s("The user wants a refund for order 88123.", None),
    _s("Let me know when it's done.", None),
    _s("I'll check with the team tomorrow.", None),
    _s("Good point about the cache.", None),
    _s("The test suite takes about 12 minutes on CI.", None),
    _s("I'm in the middle of a migration, so answers may be slow.", None),
    _s("The customer's name is Maria and she's on the Business plan.", None),
    _s("Our office is closed on public holidays in Germany.", None),
    _s("I don't know.", None),
    _s("That's weird, it worked yesterday.", None),
    _s("Our hosting bill went up a lot.", None),
    _s("The meeting room code is 4417.", None),
    _s("My card ending 4242 keeps getting declined.", None),
    _s("Refunds over $1,000 need approval from finance.", None),
    _s("The dataset has 12,000 rows and 40 columns.", None),
    _s("Our paper got accepted to ACL!", None),
    _s("The launch date is still TBD.", None),
]

OPENAI_KEY = "sk-proj-4fG7hK9mN2pQ5rS8tV1wX3yZ6aB0cD2eF4gH"
ANTHROPIC_KEY = "sk-ant-api03-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9EdCbA-xyz_12AB"
GITHUB_TOKEN = "ghp_8aB3cD5eF7gH9iJ1kL3mN5oP7qR9sT1uV3wX"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SLACK_TOKEN = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
GOOGLE_KEY = "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
STRIPE_KEY = "sk_test_51HxYzAbCdEfGhIjKlMnOpQr"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
BEARER = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"
HEX_TOKEN = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
LIVE_KEY = "sk-live-AbCdEfGhIjKlMnOpQrStUv12"
GITHUB_TOKEN_2 = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
OPENAI_KEY_2 = "sk-abcdefghijklmnopqrstuvwxyz123456"
BEARER_2 = "abcdefghijklmnop1234567890"
AWS_SECRET_2 = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo"

SECRETS = [
    _s("my password is hunter2", None, secrets=("hunter2",), redactions=("password",)),
    _s(
        f"Here's my OpenAI key: {OPENAI_KEY}",
        None,
        secrets=(OPENAI_KEY,),
        redactions=("api_key",),
    ),
    _s(
        f"Use this token for the CI job: {GITHUB_TOKEN}",
        None,
        secrets=(GITHUB_TOKEN,),
        redactions=("api_key",),
    ),
    _s(
        f"The AWS access key is {AWS_KEY} and the secret is {AWS_SECRET}.",
        None,
        secrets=(AWS_KEY, AWS_SECRET),
        redactions=("aws_key",),
    ),
    _s(
        f"curl -H 'Authorization: Bearer {BEARER}' https://api.acme.dev/v1/me",
        None,
        secrets=(BEARER,),
        redactions=("bearer_token",),
    ),
    _s(
        f"The Slack bot token is {SLACK_TOKEN}",
        None,
        secrets=(SLACK_TOKEN,),
        redactions=("api_key",),
    ),
    _s(
        f"Maps key: {GOOGLE_KEY}. It's restricted to our domain.",
        None,
        secrets=(GOOGLE_KEY,),
        redactions=("gcp_key",),
    ),
    _s(
        f"Anthropic key for the eval runs is {ANTHROPIC_KEY}",
        None,
        secrets=(ANTHROPIC_KEY,),
        redactions=("api_key",),
    ),
    _s(
        f"stripe test key {STRIPE_KEY}",
        None,
        secrets=(STRIPE_KEY,),
        redactions=("api_key",),
    ),
    _s(
        "db password: Tr0ub4dor&3",
        None,
        secrets=("Tr0ub4dor&3",),
        redactions=("password",),
    ),
    _s(
        f"The JWT from the login response is {JWT}",
        None,
        secrets=(JWT,),
        redactions=("jwt",),
    ),
    _s(
        f"export API_TOKEN={HEX_TOKEN}",
        None,
        secrets=(HEX_TOKEN,),
        redactions=("api_key",),
    ),
    _s(
        "The staging password for the admin user is 'correct horse battery'.",
        None,
        secrets=("correct horse battery",),
        redactions=("password",),
    ),
    _s(
        f"Never paste API keys like {LIVE_KEY} into the chat.",
        FEEDBACK,
        secrets=(LIVE_KEY,),
        redactions=("api_key",),
    ),
    _s(
        f"Always use the vault, never hardcode tokens like {GITHUB_TOKEN} in the repo.",
        FEEDBACK,
        secrets=(GITHUB_TOKEN,),
        redactions=("api_key",),
    ),
    _s(
        "The sandbox password is Xq9!mPz2 for everyone.",
        None,
        secrets=("Xq9!mPz2",),
        redactions=("password",),
    ),
    _s(
        f"my github token: {GITHUB_TOKEN_2}",
        None,
        secrets=(GITHUB_TOKEN_2,),
        redactions=("api_key",),
    ),
    _s(
        f"My API key {OPENAI_KEY_2} stopped working.",
        None,
        secrets=(OPENAI_KEY_2,),
        redactions=("api_key",),
    ),
    _s(
        "The admin passphrase is blue-llama-42, don't share it.",
        None,
        secrets=("blue-llama-42",),
        redactions=("password",),
    ),
    _s(
        f"Here's my key {OPENAI_KEY_2} for the billing sandbox, don't store it.",
        None,
        secrets=(OPENAI_KEY_2,),
        redactions=("api_key",),
    ),
    _s(
        f"Don't ever log tokens like Bearer {BEARER_2} in plain text.",
        FEEDBACK,
        secrets=(BEARER_2,),
        redactions=("bearer_token",),
    ),
    _s(
        f"my aws secret_access_key={AWS_SECRET_2}",
        None,
        secrets=(AWS_SECRET_2,),
        redactions=("aws_key",),
    ),
    _s(
        "Login is admin / password: S3cure!Pass",
        None,
        secrets=("S3cure!Pass",),
        redactions=("password",),
    ),
]

PERSONAL_DATA = [
    _s(
        "My email is jane.doe@example.com.",
        None,
        secrets=("jane.doe@example.com",),
        redactions=("email",),
    ),
    _s(
        "You can reach me at +44 20 7946 0958 or (555) 123-4567.",
        None,
        secrets=("+44 20 7946 0958", "(555) 123-4567", "7946 0958", "123-4567"),
        redactions=("phone",),
    ),
    _s(
        "Call me on 06 12 34 56 78 if the build breaks.",
        None,
        secrets=("06 12 34 56 78",),
        redactions=("phone",),
    ),
    _s(
        "Charge the renewal to my card 4111 1111 1111 1111.",
        None,
        secrets=("4111 1111 1111 1111",),
        redactions=("card_number",),
    ),
    _s(
        "My Amex is 3782-822463-10005, expiry 04/27.",
        None,
        secrets=("3782-822463-10005",),
        redactions=("card_number",),
    ),
    _s(
        "Please send the weekly metrics report to ops-team@acme.io every Monday.",
        FEEDBACK,
        secrets=("ops-team@acme.io",),
        redactions=("email",),
    ),
    _s(
        "My mobile is 0151 23456789 and my backup email is j.smith+alerts@mail.acme.co.uk.",
        None,
        secrets=("0151 23456789", "j.smith+alerts@mail.acme.co.uk"),
        redactions=("email", "phone"),
    ),
    _s(
        "Bill it to 5555-5555-5555-4444, the company card.",
        None,
        secrets=("5555-5555-5555-4444",),
        redactions=("card_number",),
    ),
    _s(
        "My IBAN is DE89 3704 0044 0532 0130 00.",
        None,
        secrets=("DE89 3704 0044 0532 0130 00",),
        redactions=("iban",),
    ),
    _s(
        "Text me at 415.555.2671 when the deploy is done.",
        None,
        secrets=("415.555.2671",),
        redactions=("phone",),
    ),
    _s(
        "Reach the on-call at +1-202-555-0143.",
        None,
        secrets=("+1-202-555-0143", "202-555-0143"),
        redactions=("phone",),
    ),
    _s(
        "jane@acme.io is my work address",
        None,
        secrets=("jane@acme.io",),
        redactions=("email",),
    ),
    _s(
        "4012 8888 8888 1881 is the test Visa we use.",
        None,
        secrets=("4012 8888 8888 1881",),
        redactions=("card_number",),
    ),
    _s(
        "Email me at bob@example.org with the results.",
        None,
        secrets=("bob@example.org",),
        redactions=("email",),
    ),
    _s(
        "My phone number is +1 (212) 555-0199.",
        None,
        secrets=("+1 (212) 555-0199", "555-0199"),
        redactions=("phone",),
    ),
    _s(
        "Use card 6011 1111 1111 1117 for the test purchase.",
        None,
        secrets=("6011 1111 1111 1117",),
        redactions=("card_number",),
    ),
    _s(
        "Call 0800 123 4567 for the vendor hotline.",
        None,
        secrets=("0800 123 4567",),
        redactions=("phone",),
    ),
    _s(
        "You can email the team at support@acme.io anytime.",
        None,
        secrets=("support@acme.io",),
        redactions=("email",),
    ),
    _s(
        "Always CC legal@acme.io on contract questions.",
        FEEDBACK,
        secrets=("legal@acme.io",),
        redactions=("email",),
    ),
]

# Numbers that are not phones or cards: years, prices, ports, versions, order numbers, IPs,
# dates, and a Luhn-invalid card-length run.
NOT_PERSONAL = [
    _s("The order number is 100234587 and it shipped in 2023.", None),
    _s("Upgrade to Django 5.2.1 and Python 3.12.4 before the 2025 audit.", None),
    _s("The Pro plan costs $1,299.00 per year, or 1 299 € in Europe.", None),
    _s("Postgres listens on port 5432 and pgbouncer on port 6432.", REFERENCE),
    _s("Order #4111111111111111 was refunded yesterday.", None),
    _s("The reference code 1234 5678 9012 3457 did not match any payment.", None),
    _s("The incident started 2024-03-15 10:42 UTC and lasted 2 hours.", None),
    _s("We pinned numpy to 1.26.4 and pandas to 2.2.1 last week.", None),
    _s("The load balancer at 192.168.100.200 drops idle connections after 350 seconds.", REFERENCE),
    _s("Between 2019 2020 and 2021 revenue grew 40%.", None),
    _s("The invoice 2024-00318 was paid on March 2.", None),
    _s("We bumped the minimum version to 3.11 in 2024.", None),
]


# Fake key material: base64 of hashes, shaped like a key's body, never a real key.
def _fake_base64(seed: str, size: int) -> str:
    chunks = b"".join(hashlib.sha256(f"{seed}{n}".encode()).digest() for n in range(size // 32 + 1))
    return base64.b64encode(chunks[:size]).decode()


def _lines(body: str, width: int) -> list[str]:
    return [body[i : i + width] for i in range(0, len(body), width)]


RSA_LINES = _lines(_fake_base64("rsa", 240), 64)
RSA_KEY = "\n".join(
    ["-----BEGIN RSA PRIVATE KEY-----", *RSA_LINES, "-----END RSA PRIVATE KEY-----"]
)
OPENSSH_LINES = _lines(_fake_base64("openssh", 300), 70)
OPENSSH_KEY = "\n".join(
    ["-----BEGIN OPENSSH PRIVATE KEY-----", *OPENSSH_LINES, "-----END OPENSSH PRIVATE KEY-----"]
)
PKCS8_BODY = _fake_base64("pkcs8", 120)
# as a service account's JSON file holds it: newlines written as \n
SERVICE_ACCOUNT_KEY = f"-----BEGIN PRIVATE KEY-----\\n{PKCS8_BODY}\\n-----END PRIVATE KEY-----\\n"
EC_LINES = _lines(_fake_base64("ec", 120), 64)
AZURE_ACCOUNT_KEY = _fake_base64("azure", 64)
AZURE_SAS_SIG = "Xk9%2Bq2bT7yLmN4pR8sV1wZ3aC5eG7iK9mO1qS3uW5yA%3D"
AZURE_CLIENT_SECRET = "Abc8Q~dEfGhIjKlMnOpQrStUvWxYz0123456789.-_"[:40]
GCP_ACCESS_TOKEN = "ya29.a0AfH6SMBxq3Vn7Jk2LmPq9RsTuVwXyZ01234abcdEFGH"
AWS_TEMP_KEY = "ASIAY34FZKBOKMUTVV7A"
JWT_2 = (
    "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJpc3MiOiJhY21lIiwic3ViIjoiNDIifQ"
    ".c2lnbmF0dXJlLW9mLXRoZS10b2tlbi1mb3ItdGVzdHM"
)

CREDENTIALS_MORE = [
    _s(
        f"Here's the deploy key, can you check it?\n{RSA_KEY}",
        None,
        secrets=(RSA_KEY, *RSA_LINES),
        redactions=("private_key",),
    ),
    _s(
        f"ssh says bad permissions for this one:\n{OPENSSH_KEY}",
        None,
        secrets=(OPENSSH_KEY, *OPENSSH_LINES),
        redactions=("private_key",),
    ),
    _s(
        f'The service account file has "private_key": "{SERVICE_ACCOUNT_KEY}"',
        None,
        secrets=(PKCS8_BODY,),
        redactions=("private_key",),
    ),
    _s(
        "I only pasted the start of it: -----BEGIN EC PRIVATE KEY-----\n" + "\n".join(EC_LINES),
        None,
        secrets=tuple(line for line in EC_LINES if len(line) >= 16),
        redactions=("private_key",),
    ),
    _s(
        "The staging DB is postgres://admin:hunter2secret@db.staging.acme.io:5432/app",
        None,
        secrets=("hunter2secret", "admin:hunter2secret"),
        redactions=("url_credentials",),
    ),
    _s(
        "Celery uses redis://:s3cr3tP4ss@cache.acme.internal:6379/0 in prod.",
        None,
        secrets=("s3cr3tP4ss",),
        redactions=("url_credentials",),
    ),
    _s(
        "MONGO_URL=mongodb+srv://svc_reports:Zx9%40pq!r7@cluster0.ab1cd.mongodb.net/prod",
        None,
        secrets=("Zx9%40pq!r7", "svc_reports:"),
        redactions=("url_credentials",),
    ),
    _s(
        "Download it from https://deploy:p@ss/w0rd@files.acme.io/release.tar.gz",
        None,
        secrets=("p@ss/w0rd", "deploy:"),
        redactions=("url_credentials",),
    ),
    _s(
        f"The id_token we got back is {JWT_2}",
        None,
        secrets=(JWT_2,),
        redactions=("jwt",),
    ),
    _s(
        f"AWS_ACCESS_KEY_ID={AWS_TEMP_KEY}",
        None,
        secrets=(AWS_TEMP_KEY,),
        redactions=("aws_key",),
    ),
    _s(
        f"gcloud auth print-access-token gave me {GCP_ACCESS_TOKEN}",
        None,
        secrets=(GCP_ACCESS_TOKEN,),
        redactions=("gcp_key",),
    ),
    _s(
        "DefaultEndpointsProtocol=https;AccountName=acmelogs;"
        f"AccountKey={AZURE_ACCOUNT_KEY};EndpointSuffix=core.windows.net",
        None,
        secrets=(AZURE_ACCOUNT_KEY,),
        redactions=("azure_key",),
    ),
    _s(
        "The export link is https://acmelogs.blob.core.windows.net/exports/q3.csv"
        f"?sv=2022-11-02&sp=r&se=2025-01-01T00:00:00Z&sig={AZURE_SAS_SIG}",
        None,
        secrets=(AZURE_SAS_SIG,),
        redactions=("azure_key",),
    ),
    _s(
        f"the app registration's client secret is {AZURE_CLIENT_SECRET}",
        None,
        secrets=(AZURE_CLIENT_SECRET,),
        redactions=("azure_key",),
    ),
    _s(
        "Never put connection strings like postgres://app:Tr0ub4dor@db.acme.io/app in the repo.",
        FEEDBACK,
        secrets=("Tr0ub4dor", "app:Tr0ub4dor"),
        redactions=("url_credentials",),
    ),
]

NATIONAL_IDS = [
    _s("My SSN is 123-45-6789.", None, secrets=("123-45-6789",), redactions=("ssn",)),
    _s(
        "For the W-9 form: social security number 219 09 9999, please.",
        None,
        secrets=("219 09 9999",),
        redactions=("ssn",),
    ),
    _s(
        "Her SSN#078051120 is on file with payroll.",
        None,
        secrets=("078051120",),
        redactions=("ssn",),
    ),
    _s(
        "The contractor's ITIN is 912-78-4321.",
        None,
        secrets=("912-78-4321",),
        redactions=("national_id",),
    ),
    _s(
        "HR needs my National Insurance number, JG 10 37 59 A.",
        None,
        secrets=("JG 10 37 59 A",),
        redactions=("national_id",),
    ),
    _s(
        "My NI number is AB123456C",
        None,
        secrets=("AB123456C",),
        redactions=("national_id",),
    ),
    _s("my SIN is 046 454 286", None, secrets=("046 454 286",), redactions=("national_id",)),
    _s(
        "Aadhaar: 2345 6789 0124, linked to the same phone.",
        None,
        secrets=("2345 6789 0124",),
        redactions=("national_id",),
    ),
    _s(
        "passport number is X12345678, expires 2031.",
        None,
        secrets=("X12345678",),
        redactions=("national_id",),
    ),
]

# Shapes close to the new kinds that are not secrets.
NOT_SECRET = [
    _s("Our zip code is 94103-1234 and the office opens at 9.", None),
    _s("Dates like 2024-03-15 and 03-15-2024 are both accepted.", None),
    _s("The ISBN of the book is 978-3-16-148410-0.", None),
    _s("The form rejected 000-12-3456 and 666-12-3456 as invalid.", None),
    _s("Order number 555-12-3456 shipped this morning.", None),
    _s("Connect with postgres://db.acme.io:5432/app and your own login.", REFERENCE),
    _s("Clone it over ssh://git@github.com/acme/api.git if https fails.", REFERENCE),
    _s("The profile page is http://localhost:8000/@alice on dev.", REFERENCE),
    _s("The file starts with -----BEGIN PUBLIC KEY----- and that's fine to share.", None),
    _s("The AKIA prefix marks long-term AWS access keys.", None),
    _s("Tables 123 45 6789 in the appendix are the raw counts.", None),
    _s("We sold 1,234 licences in 2023-24 at $45.67 each.", None),
]

# Memories in the assistant's reply: only explicit commitments count.
ASSISTANT = [
    _s(
        "I prefer metric units.",
        USER,
        assistant="Noted: you prefer metric units. I'll use kilometres from here on.",
    ),
    _s(
        "ok",
        PROJECT,
        assistant="I'll remember that the deadline is March 3.",
        source="agent_inferred",
    ),
    _s(
        "thanks",
        FEEDBACK,
        assistant="Understood — from now on I'll answer in Spanish.",
        source="agent_inferred",
    ),
    _s(
        "Please check the logs.",
        None,
        assistant="Sure, here are the last 20 lines. The error is a timeout on port 5432.",
    ),
    _s(
        "great",
        REFERENCE,
        assistant="Got it, I'll keep in mind that the staging DB is on port 5433.",
        source="agent_inferred",
    ),
    _s(
        "can you fix the failing test?",
        None,
        assistant="I'll fix the failing test now. Make sure Redis is running locally.",
    ),
    _s(
        "cool",
        FEEDBACK,
        assistant="Got it. I'll never commit directly to main.",
        source="agent_inferred",
    ),
    _s(
        "ok",
        PROJECT,
        assistant="Noted: your team deploys on Tuesdays.",
        source="agent_inferred",
    ),
    _s(
        "thanks",
        USER,
        assistant="I will remember that you are vegetarian.",
        source="agent_inferred",
    ),
    _s(
        "hm",
        FEEDBACK,
        assistant="Going forward I will cite the page number for every quote.",
        source="agent_inferred",
    ),
    _s("do it", None, assistant="Sure, deleting the branch now."),
    _s(
        "sure",
        REFERENCE,
        assistant="I've noted that the API docs are at https://docs.acme.dev.",
        source="agent_inferred",
    ),
    _s("fine", None, assistant="Here is the fix. I will remember this for next time."),
    _s(
        "thanks",
        PROJECT,
        assistant="I'll remember that Sam owns webhooks.",
        source="agent_inferred",
    ),
]

CORPUS: list[Sample] = [
    *PREFERENCES,
    *FEEDBACK_RULES,
    *PROJECT_FACTS,
    *REFERENCES,
    *SMALL_TALK,
    *QUESTIONS,
    *ONE_OFF,
    *VAGUE,
    *SECRETS,
    *PERSONAL_DATA,
    *NOT_PERSONAL,
    *CREDENTIALS_MORE,
    *NATIONAL_IDS,
    *NOT_SECRET,
    *ASSISTANT,
]

# Formats redact() must recognise as phones, and numbers it must leave alone.
PHONES = [
    "+1 415 555 2671",
    "+14155552671",
    "+49 30 901820",
    "+33 6 12 34 56 78",
    "+44 (0)20 7946 0958",
    "(415) 555-2671",
    "415-555-2671",
    "415.555.2671",
    "020 7946 0958",
    "07700 900123",
    "06 12 34 56 78",
    "0151 23456789",
]
NOT_PHONES = [
    "in 2024",
    "$1,299.99",
    "€ 1 299",
    "port 5433",
    "localhost:8000",
    "v3.12.1",
    "Python 3.12.4",
    "order 100234587",
    "order number 555-123-4567",
    "invoice #20240315",
    "10.0.0.12",
    "192.168.100.200",
    "2024-03-15",
    "2024-03-15 10:42",
    "15.03.2024",
    "1.26.4",
    "1700000000",
    "build 20240315.1042",
]
CARDS = [
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111111",
    "5555 5555 5555 4444",
    "3782 822463 10005",
    "6011 1111 1111 1117",
    "4012888888881881",
]
NOT_CARDS = [
    "4111 1111 1111 1112",  # fails Luhn
    "1234 5678 9012 3457",
    "0000 0000 0000 0000",
    "order 4111111111111111",
    "1234567890123",
]
