"""Memory candidates found in a conversation turn, by rules (no model, no database).

`detect(user_message, assistant_response)` splits the text into sentences and proposes the ones
worth remembering, typed as in MEMORY.md: preferences and background → `user`; corrections
and always/never rules → `feedback`; deadlines, dates and ongoing work → `project`; pointers
to docs, URLs, hosts and ports → `reference`. A person approves or rejects each one.

The write policy:
- secrets and personal data are redacted first (`memory_ui.redaction.redact`), and the kinds
  noted; a sentence whose point is a credential ("my password is …") is dropped, and a
  credential may stay (redacted) only inside a rule about credentials ("never paste API keys
  like … into chat");
- dropped: small talk, questions, one-off requests ("just this once", "for now", "this time",
  "temporarily", "for this email"), plain requests without a lasting rule, vague statements
  without a cue, and sentences that no longer say anything once cut to 150 characters;
- from the assistant's reply only explicit commitments ("Noted: …", "I'll remember that …",
  "from now on I'll …"), as `agent_inferred` and at a lower importance;
- importance (0–1) from explicitness ("remember", "always", "never", "from now on",
  "important", "note that", "make sure"), signal strength (numbers, names, hosts, dates, code)
  and first person for preferences, lowered by hedges ("maybe", "I think"). Repetition is
  the lead's hook, not modelled here: `proposals.candidate_propose` merges a re-proposed
  sentence into its memory and raises its importance by `REPETITION_BONUS` each time.

Everything is precompiled; cheap string tests run before the heavier regexes, which use
possessive quantifiers and bounded repeats (no catastrophic backtracking).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from memory_ui.redaction import CREDENTIAL_KINDS, KINDS, MARKER, redact
from memory_ui.text import normalize

MAX_CONTENT = 150  # models.MAX_CONTENT, repeated so this module never imports Django
MAX_EVIDENCE = 500
MAX_SCAN = 20_000  # characters of a message read: memories are not buried in pasted logs
AGENT_FACTOR = 0.75  # an assistant's "noted: …" is weaker evidence than the user saying it
THRESHOLD = 1.5  # the least cue weight that makes a sentence a candidate
THOUSANDTH = Decimal("0.001")


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


@dataclass(frozen=True, slots=True)
class Candidate:
    """One proposed memory: what to remember, as what, how important, and why."""

    type: str
    content: str
    importance: Decimal
    source: str
    evidence: str
    redactions: list[str] = field(default_factory=list, hash=False)
    signals: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Sentences

_SPLIT = re.compile(r"(?<=[.!?…])\s+|\s*\n\s*")
_ABBREVIATIONS = _wordset(
    "e.g. i.e. etc. vs. mr. mrs. ms. dr. approx. no. fig. inc. st. jr. sr. cf. al."
)
_BULLET = re.compile(r"^(?:[-*•>]+|\d{1,2}[.)])\s+")


def _sentences(text: str) -> list[str]:
    pieces: list[str] = []
    pending = ""
    for raw in _SPLIT.split(text):
        if not raw:
            continue
        piece = f"{pending} {raw}" if pending else raw
        last = piece.rsplit(None, 1)[-1].lower() if piece.strip() else ""
        if last in _ABBREVIATIONS:
            pending = piece
            continue
        pending = ""
        piece = _BULLET.sub("", piece.strip())
        if piece:
            pieces.append(piece)
    if pending.strip():
        pieces.append(pending.strip())
    return pieces


# --------------------------------------------------------------------------------------------
# Cues

_WORD = re.compile(r"[a-z0-9][a-z0-9'_-]*")
_SMALL_TALK = _wordset(
    """hi hello hey yo thanks thank thx ty ok okay k cool great nice awesome perfect lol lmao
    haha hah hehe sure yes yeah yep no nope nah got it sounds good fine bye goodbye cheers
    morning night evening afternoon how are is it going what's whats up sup np problem welcome
    you're wow oops hmm ah oh ugh one well done job lgtm ship agreed exactly right true fair
    enough makes sense love amazing brilliant wonderful excellent neat sweet alright all that's
    that this works worked so much very a lot for the help again and have day you your man
    dude there appreciate appreciated it's looks good! all set deal kk catch point idea"""
)
_ONE_OFF = (
    "just this once",
    "for now",
    "this time",
    "temporarily",
    "for the moment",
    "for today",
    "just today",
    "one-off",
    "one off",
    "only once",
    "right this minute",
)
_ONE_OFF_THIS = re.compile(
    r"\b(?:for|in|on) this (?:one|task|answer|reply|response|question|message|session|file"
    r"|function|email|ticket|pr|draft|run|chart|table|paragraph|document|query|slide|post"
    r"|thread|case|call|page)\b(?! (?:and|or) (?:all|every|future))"
)
_QUESTION_START = _wordset(
    "what what's whats how why when where who whom which is are can could would will do does "
    "did should shall may might have has"
)
_HEDGES = ("maybe", "perhaps", "probably", "i think", "i guess", "might", "not sure", "kind of")
_EXPLICIT = (
    ("remember", "remember"),
    ("always", "always"),
    ("never", "never"),
    ("from now on", "from_now_on"),
    ("going forward", "going_forward"),
    ("moving forward", "going_forward"),
    ("important", "important"),
    ("note that", "note_that"),
    ("make sure", "make_sure"),
    ("keep in mind", "keep_in_mind"),
    ("don't forget", "dont_forget"),
    ("for future reference", "for_future_reference"),
)
# a request becomes a lasting rule with one of these
_GENERALIZERS = _wordset(
    """all every any always never whenever default instead consistently everywhere future
    anymore only each generally unless"""
)
_GENERAL_PHRASES = (
    "from now on",
    "going forward",
    "moving forward",
    "in the future",
    "in future",
    "by default",
    "every time",
    "each time",
    "instead of",
    "rather than",
    "this codebase",
    "this repo",
    "this project",
    "our codebase",
    "our repo",
    "no longer",
    "not anymore",
    "in general",
    "as a rule",
)
# "Keep answers under 200 words" is about every answer: a rule, not a one-off request
_RESPONSE_NOUNS = _wordset(
    "answers replies responses explanations summaries examples suggestions messages"
)
_DATE_VERBS = _wordset(
    """by until before every each starts start ends end moved moves begins closes opens
    expires renews"""
)
_DETERMINERS = _wordset(
    """the this that these those my your our their his her its it a an some me us him them
    one two three four five again"""
)
_CONDITIONS = _wordset("before after when whenever once until if")
_IMPERATIVES = _wordset(
    """use prefer write keep put run add avoid call name format reply answer respond stick
    switch make include cite quote send post check follow default set pin open create commit
    push merge deploy test document comment log store save mention explain give show list sort
    treat assume address greet sign end start begin label tag ask let wrap split return raise
    handle prefix suffix indent type lint refer link ping notify skip omit drop remove ignore
    leave double-check verify escalate"""
)
_FEEDBACK_PHRASES = (
    ("address me as", 2.0, "naming"),
    ("refer to me as", 2.0, "naming"),
    ("from now on", 2.0, "from_now_on"),
    ("going forward", 2.0, "going_forward"),
    ("moving forward", 2.0, "going_forward"),
    ("in the future", 1.5, "in_future"),
    ("by default", 1.5, "by_default"),
    ("every time", 1.5, "every_time"),
    ("each time", 1.5, "every_time"),
    ("remember to", 2.0, "remember"),
    ("don't forget to", 2.0, "dont_forget"),
    ("do not forget to", 2.0, "dont_forget"),
    ("make sure", 1.0, "make_sure"),
    ("be sure to", 1.0, "make_sure"),
    ("keep using", 2.0, "confirmation"),
    ("keep doing", 2.0, "confirmation"),
    ("keep it that way", 2.0, "confirmation"),
    ("keep doing that", 2.0, "confirmation"),
    ("no longer", 1.5, "correction"),
    ("not anymore", 1.5, "correction"),
    ("instead of", 1.5, "instead"),
)
_CORRECTION_START = re.compile(
    r"^(?:(?:no|nope|nah|actually|wrong|incorrect|not quite|not really|that's (?:wrong|not right"
    r"|incorrect|not correct|not what i (?:asked|meant|wanted))|that is (?:wrong|not right"
    r"|incorrect)|you're wrong|correction)\b[\s,:;.!-]*){1,4}+(?=\S)"
)
# "I asked for Python, not JavaScript!"
_CORRECTION_CLAIM = re.compile(
    r"^i (?:asked for|said|meant|told you|wanted|need(?:ed)?)\b[^.]{0,80}?,? (?:not|instead of"
    r"|rather than)\b"
)
_CORRECTION_WORDS = _wordset(
    "hmm hm no nope that's that is not right wrong incorrect correct quite it's actually ugh"
)
_RULE_START = re.compile(
    r"^(?:(?:please|pls|kindly)\s+)?(?:always|never|don't|dont|do not|avoid|only)\b"
    r"|^(?:(?:please|pls)\s+)?stop \w+ing\b"
    r"|^(?:you|we)(?: should| must| need to| have to|'ll| will)?(?: always| never| not)\b"
    r"|^(?:you|we) (?:should|must|need to|have to) (?:\w+ ){0,6}?(?:all|every|any|each|only)\b"
    r"|[,;:—–]\s*(?:(?:please|and|but)\s+)?(?:always|never|don't|do not)\s+[a-z]"
)
_ADVERB = (
    r"(?:really |strongly |much |generally |usually |definitely |mostly |mainly |personally "
    r"|also |always |kind of |tend to |normally |typically |often |still |just )?"
)
_FIRST_PERSON_PREFERENCE = re.compile(
    rf"\b(?:i|you)(?:'d| would)? {_ADVERB}(?:prefer|rather|like|love|hate|dislike"
    r"|enjoy|favou?r|can't stand|cannot stand|don't like|do not like|don't want|do not want"
    r"|want|need|find)s?\b( (?:(?:it|that|this|these|those|your|the idea)\b(?! when\b| if\b)"
    r"|the (?:first|second|third|last|other|former|latter|previous|new|old|original)\b|both\b"
    r"|option \w+|(?:this|that|the) (?:one|version|option|approach|draft)\b))?"
)
_STYLE_NOUNS = _wordset(
    """answers answer responses response replies reply explanations explanation examples code
    summaries summary output comments comment messages emails reports units format formatting
    bullet bullets points tables language tone style docstrings tests variable variables names
    citations sources links diagrams charts plots short shorter long longer concise brief
    detailed plain simple metric imperial english spanish french german dark light mode
    emoji emojis markdown type hints hints spaces tabs numbers dates"""
)
_BACKGROUND = re.compile(
    r"\b(?:(?:i(?:'m| am)|you(?:'re| are)) (?:a|an|the)\b(?! (?:bit|little|lot|few|big fan)\b)"
    r"|(?:i(?:'m| am)|you(?:'re| are)) (?:new to|not (?:a|an) |not familiar|familiar with"
    r"|based in|located in"
    r"|colou?r[- ]?blind|vegetarian|vegan|left-handed|dyslexic|deaf|blind|fluent in|allergic)"
    r"|i (?:work|am working) (?:as|at|for|in|on the \w+ team|with)\b"
    rf"|i (?:live|am based) in\b|i {_ADVERB}(?:speak|code in|write in|write|use|work in) "
    r"|i(?:'ve| have) been (?:a|an) |i(?:'ve| have) (?:\d+|many|several|a few) years? of"
    r"|i (?:can't|cannot|can not|don't have|do not have) (?:install|use|access|run|share|see"
    r"|open|download|afford|admin|permission|rights|access)\b"
    r"|i (?:run|lead|manage|head|own) (?:the |a |our )?(?:\w+ )?(?:team|department|group|org"
    r"|organization|company|lab|squad|office|store|shop|practice|clinic)\b"
    r"|(?:my|your) (?:name|role|job|title|team|background|time ?zone|pronouns|native language"
    r"|goal|goals"
    r"|manager|company|preferred|preference|favou?rite|stack|setup|editor|os|laptop)\b"
    r"|(?:works|work) best for me|call me [A-Za-z]|^as an? (?:\w+ )?(?:engineer|developer"
    r"|designer|manager|scientist|researcher|student|teacher|nurse|doctor|lawyer|analyst"
    r"|writer|founder|admin|administrator|consultant|marketer|accountant|architect|lead"
    r"|beginner|newcomer|non-native speaker)\b"
    r"|you(?:'re| are) (?:a|an) \w+ (?:engineer|developer|scientist|designer|manager|lead"
    r"|analyst|researcher|student|writer|admin))"
)
_DEADLINE_WORDS = _wordset(
    """deadline deadlines due eta milestone cutoff cut-off freeze go-live kickoff kick-off
    launch launches launching release releases releasing ship ships shipping demo demos
    sprint roadmap meeting review interview conference workshop offsite audit presentation
    submission exam defense renewal trip vacation holiday onsite deprecated deprecate sunset
    eol end-of-life"""
)
_STRONG_DEADLINE = _wordset("deadline deadlines due eta milestone cutoff cut-off freeze")
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATE = re.compile(
    rf"\b(?:{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}"
    r"|(?:by|in|until|before|late|early|mid|end of|since|from|mid-) (?:mid-|early |late )?"
    r"(?:january|february|march|april|may|june|july|august|september|october|november"
    r"|december)|(?:january|february|april|june|july|august|september|october|november"
    r"|december)"
    r"|(?:mon|tues|wednes|thurs|fri|satur|sun)day|tomorrow|tonight|next (?:week|month"
    r"|quarter|year|sprint)|this (?:quarter|sprint|week|month)|end of (?:the )?(?:day|week"
    r"|month|quarter|year|sprint)|eod|eow|q[1-4]|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}"
    r"|h[12] 20\d\d|in \d+ (?:days|weeks|months)"
    r"|(?:on|by|until|before) the \d{1,2}(?:st|nd|rd|th))\b"
)
_PROJECT_NOUNS = (
    r"(?:stack|backend|frontend|app|apps|service|services|api|database|project|product|codebase"
    r"|repo|pipeline|infra|infrastructure|team|client|customer|migration|budget|sla|slas"
    r"|policy|process|target|goal|goals|quota|limit|plan|pricing|convention|conventions|customers|users|clients"
    r"|workflow|release cycle|on-call|rotation|standup|study|paper|thesis|experiment)"
)
_ONGOING = re.compile(
    r"\b(?:we(?:'re| are)|i(?:'m| am)|the team is|our team is|they(?:'re| are)) (?:currently |"
    r"still |now )?(?:working on|migrating|moving|rewriting|building|porting|refactoring"
    r"|upgrading|switching|replacing|rolling out|shipping|launching|preparing|running|writing"
    r"|designing|redesigning|evaluating|testing|planning|onboarding|blocked on|waiting on"
    r"|waiting for|halfway|debugging|investigating|implementing|prototyping|integrating"
    r"|benchmarking|analy[sz]ing|drafting|researching|aiming to|hoping to|trying to|using"
    r"|on version|on v?\d)\b"
    r"|\bwe(?:'re| are) (?:a|an) "
    r"|\b(?:blocked on|blocked by|in progress|on hold|is halfway|are halfway|is underway)\b"
    r"|\b(?:owns|own the|is responsible for|are responsible for|is in charge of|maintains"
    r"|is the owner of|is the point of contact for)\b"
    r"|\b(?:we|our team|the team|my team|your team) (?:use|uses|run|runs|deploy|deploys|host"
    r"|hosts|target"
    r"|targets|depend on|depends on|build|store|ship|support|only support)\b"
    rf"|\bour {_PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:is|are|runs|uses|targets|wants|needs"
    r"|depends|moved|has|requires|supports)\b"
    rf"|\bthe {_PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:runs|uses|targets|wants|needs|depends"
    r"|moved|has to|must|requires|supports|is due|is built|is written)\b"
    rf"|\bthe {_PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:is|are) (?:[\w$€£~-]+ ){{0,2}}?\d"
    r"|\bdeploy target\b|\bdeploys? to\b|\bis deployed (?:on|to)\b"
)
_URL = re.compile(r"\b(?:https?|s3|gs|ftp)://[^\s<>\"']{2,2000}+|\bwww\.[^\s<>\"']{2,2000}+")
_HOST = re.compile(
    r"\b(?:[a-z0-9](?:[a-z0-9-]{0,62}+)\.){1,6}(?:com|io|dev|net|org|internal|local|lan"
    r"|cloud|app|ai|co|corp|int|svc|so|sh|us|eu|uk|de|fr|xyz|tech|site|page)\b(?:/[^\s]*+)?"
    r"|\blocalhost\b",
    re.IGNORECASE,
)
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")
_PORT = re.compile(
    r"\bport \d{2,5}\b|\b[a-z][\w.-]{0,253}+(?<!\.):\d{2,5}\b"
    r"|\b(?:listens?|listening|runs?|running|served"
    r"|serves?|exposed|binds?|bound|available) on (?!(?:19|20)\d\d\b)\d{2,5}\b"
    r"|\b(?:is|are|replica|replicas) on (?!(?:19|20)\d\d\b)\d{4,5}\b",
    re.IGNORECASE,
)
_PATH = re.compile(
    r"(?<![\w.])(?:~|\.{1,2})?/[\w.-]{1,100}+(?:/[\w.-]{1,100}+)*+"
    r"|\b[\w-]{1,100}+(?:/[\w.-]{1,100}+)*+\.(?:md|py|yaml|yml|json|toml|txt|ts|js|sql|sh|cfg"
    r"|ini|env|ipynb|pdf|csv|html|rst)\b"
    r"|\b[\w.-]{1,100}+(?:/[\w.-]{1,100}+){2,}+"
)
_CHANNEL = re.compile(r"(?<![\w&])#[a-z][\w-]{2,80}+")
_POINTER_NOUNS = _wordset(
    """docs doc documentation runbook runbooks wiki confluence notion dashboard dashboards
    grafana sentry jira readme playbook handbook spreadsheet sheet channel repo repository
    endpoint bucket vault kibana datadog figma drive folder page spec specs postman swagger
    knowledge kb gitlab github server host cluster database db registry status pagerduty
    opsgenie linear asana trello airtable dropbox sharepoint onedrive gdrive bitbucket
    artifactory metabase looker tableau superset jupyterhub colab overleaf zotero arxiv
    brokers broker warehouse lake queue topic index bigquery snowflake redshift"""
)
_POINTER_PLACE = re.compile(
    r"\b(?:(?:is|are|lives?|sits?|stored|kept|hosted|located|found|published|documented"
    r"|posted|tracked|listens|runs|linked|pinned) (?:at|in|on|under|from)|go(?:es)? to"
    r"|(?:see|check|consult) the)\b"
)
_STORED = (
    "live",
    "stored",
    "kept",
    "hosted",
    "documented",
    "published",
    "tracked",
    "linked",
    "pinned",
)
# "the analytics warehouse is BigQuery": a pointer named
_POINTER_IS = re.compile(r"\b(?:is|are) (?:the |our |a |an )?(?:[A-Z][\w-]+|`[^`]+`)")
_NAMED = re.compile(r"['\"`“‘]\w|\s[A-Z][\w-]*")
_COMMITMENT = re.compile(
    r"^(?:(?:ok(?:ay)?|sure|got it|understood|of course|absolutely|will do|great|thanks"
    r"|perfect|done)\b[\s,.:;!—–-]*)*"
    r"(?:noted|i(?:'ll| will) (?:remember|keep in mind|make a note|note)(?: that)?"
    r"|i(?:'ve| have) (?:noted|saved|recorded|stored|remembered)(?: that)?"
    r"|(?:saved|stored) (?:to|in) (?:my )?memory|remembered"
    r"|(?:from now on|going forward|in (?:the )?future),? (?=i(?:'ll| will) )"
    r"|(?=i(?:'ll| will) (?:always|never|no longer|stop) ))"
    r"[\s,.:;!—–-]*"
)
_POLITE_RULE = re.compile(
    r"^(?:(?:can|could|would|will) you (?:please )?)(?=.*\b(?:always|never|from now on"
    r"|going forward|in (?:the )?future|by default)\b)"
)
_LASTING = re.compile(r"\b(?:from now on|going forward|in (?:the )?future)\b")
_AGENT_SUBJECT = re.compile(r"^(?:from now on,? |going forward,? )?i(?:'ll| will) ")
_FILLER = re.compile(
    r"^(?:(?:ok(?:ay)?|so|also|and|but|btw|oh|hey|hi|hello|well|fyi|yeah|yes|alright|right"
    r"|cool|great|perfect|thanks|thank you|one more thing|quick note|heads up|by the way"
    r"|just so you know|for the record|for future reference|for your information"
    r"|(?:please )?(?:note|remember|keep in mind|bear in mind)(?: that)?(?! to\b)|important"
    r"|note|please"
    r"|pls|just|also note(?: that)?|oh and|reminder|pro tip|honestly|personally|frankly"
    r"|basically|quick (?:note|heads up|one|reminder)"
    r")\b[\s,:;!.—–-]*){1,6}+"
)
# "the passphrase is [redacted:password]": a sentence that states a credential
_STATED_SECRET = re.compile(
    r"(?:\b(?:is|was|are)|[:=])\s*[\"'`]?\[redacted:\w+\]|^\W*\[redacted:\w+\]\W* (?:is|was|are)\b"
)
_CREDENTIAL_MARKER = re.compile(rf"\[redacted:(?:{'|'.join(sorted(CREDENTIAL_KINDS))})\]")
_EXAMPLE_CUE = re.compile(
    r"\b(?:like|such as|e\.g\.|for example|for instance|including)\W+(?:[\w-]+\W+)?$",
    re.IGNORECASE,
)
_FILLER_WORDS = _wordset(
    """password passwd passphrase pwd key keys api token tokens secret secrets email mail
    address phone number mobile cell card credit debit iban account login credentials my our
    your his her is was are the a an here here's it's its this that for of to at on in use
    using and or new current old aws openai anthropic github slack stripe google bearer jwt
    header authorization auth just so you know fyi btw i me reach contact call text via with
    like be can is are am it if please redacted"""
) | frozenset(KINDS)
_COMMON_FIRST = _wordset(
    """the a an always never use don't do not we our my their this that it its please prefer
    keep write avoid make run put add send check follow stop deploy staging production prod
    api docs deadline code customer client release local grafana remember answer reply respond
    include cite open sign store log commit push merge test tests name format code
    documentation dashboards runbook style prefers likes wants needs is uses works has would
    loves hates dislikes reads lives speaks writes codes enjoys really usually mostly
    generally personally definitely strongly also timezone role team job title background
    goal goals pronouns native preferred favourite favorite there sentry support knowledge
    deploys deploy data dataset paper vpn redis postgres our sql we're we'll we've you you're
    your for when whenever in only good metrics logs now customer customers prod submission
    quick morning you'll let's kafka"""
)


@dataclass(slots=True)
class _Reading:
    """What one sentence says, before it is phrased as a memory."""

    type: str
    weight: float
    signals: list[str]


def _words(low: str) -> list[str]:
    return _WORD.findall(low)


def _clause_imperative(low: str, words: list[str]) -> list[str]:
    """The words from the imperative verb that starts the sentence, or its main clause after a
    leading phrase ("In every reply, include …"); empty if there is none."""
    if words and words[0] in _IMPERATIVES:
        return words
    comma = low.find(", ")
    if 0 < comma < 80:
        rest = _words(low[comma + 2 : comma + 60])
        if rest and rest[0] in _IMPERATIVES:
            return rest
    return []


def _generic_object(words: list[str]) -> bool:
    """An imperative whose object is a bare plural (no article, number or pronoun) is about
    every such thing: "keep PR descriptions short", "write tests for new endpoints"."""
    following = words[1:4]
    if not following or any(w in _DETERMINERS or w[0].isdigit() for w in following):
        return False
    return any(
        len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) for w in following
    )


def _is_small_talk(words: list[str]) -> bool:
    return len(words) <= 6 and all(w in _SMALL_TALK for w in words)


_IDIOM = re.compile(
    r"^(?:never ?mind|don't worry|do not worry|no worries|don't mention it|always happy"
    r"|always a pleasure|never again|never heard|always fun|never a dull)\b"
)
# past events are not upcoming work: "the deadline was yesterday"
_PAST = re.compile(r"\b(?:yesterday|last (?:week|month|year|quarter|sprint|time)|ago)\b")


def _read(core: str, low: str, words: list[str], correction: bool) -> _Reading | None:
    """The type a sentence (already stripped of fillers) most likely is, by weighted cues."""
    weights = {"user": 0.0, "feedback": 0.0, "project": 0.0, "reference": 0.0}
    signals: list[str] = []
    word_set = set(words)
    first = words[0] if words else ""

    # feedback: corrections, always/never rules, lasting instructions
    generalized = bool(word_set & _GENERALIZERS) or any(p in low for p in _GENERAL_PHRASES)
    if _RULE_START.search(low):
        weights["feedback"] += 2.0
        signals.append("rule")
    elif (command := _clause_imperative(low, words)) and (
        generalized
        or ", not " in low
        or " not " in low[:60]
        or word_set & _RESPONSE_NOUNS
        or _generic_object(command)
    ):
        weights["feedback"] += 2.0
        signals.append("imperative")
    for phrase, weight, signal in _FEEDBACK_PHRASES:
        if phrase in low:
            if weight < THRESHOLD and (generalized or word_set & _CONDITIONS):
                weight = 2.0  # "make sure the tests pass before you merge"
            weights["feedback"] = max(weights["feedback"], weight)
            signals.append(signal)
            break
    if correction:
        weights["feedback"] += 1.5
        signals.append("correction")
    if (
        weights["feedback"] == 0
        and ("always" in word_set or "never" in word_set)
        and first in ("you", "we", "please")
    ):
        weights["feedback"] += 2.0
        signals.append("rule")

    # user: preferences, role and background
    preference = _FIRST_PERSON_PREFERENCE.search(low)
    if preference and not preference.group(1):
        verb = preference.group(0)
        strong = not any(v in verb for v in (" want", " need", " find", "'d like", " would like"))
        rest = set(_words(low[preference.end() :]))
        if "you to" in low[preference.end() : preference.end() + 8]:
            # "I want you to always …" is an instruction
            if generalized:
                weights["feedback"] = max(weights["feedback"], 2.0)
                signals.append("instruction")
        elif strong or rest & _STYLE_NOUNS or generalized:
            weights["user"] += 2.5 if strong else 2.0
            signals.append("first_person")
    if _BACKGROUND.search(low) and not _ONGOING.search(low):
        weights["user"] = max(weights["user"], 2.0)
        signals.append("background")
    if weights["user"] and weights["feedback"] and first in ("i", "i'm", "i'd", "i've"):
        weights["feedback"] -= 1.0  # "I never use tabs" is about the user

    # project: deadlines, dates, ongoing work, how the project is set up
    deadline = word_set & _DEADLINE_WORDS
    if "due to" in low and "due" in deadline and not word_set & _STRONG_DEADLINE - {"due"}:
        deadline = deadline - {"due"}
    has_date = _DATE.search(low) is not None
    if has_date:
        signals.append("date")
    if deadline:
        signals.append("deadline")
        strong = bool(deadline & _STRONG_DEADLINE)
        weights["project"] += (2.0 if strong else 1.0) + (1.0 if has_date else 0.0)
    elif has_date and (word_set & _DATE_VERBS):
        weights["project"] += 1.5
    elif has_date and "on" in word_set:
        weights["project"] += 1.0
    if _ONGOING.search(low):
        weights["project"] += 2.0
        signals.append("ongoing")
    if weights["project"] and _PAST.search(low):
        weights["project"] -= 1.5
        signals.append("past")

    # reference: URLs, hosts, ports, paths, channels and named places for docs
    place = 0.0
    if ("://" in low or "www." in low) and _URL.search(core):
        place = 2.5
        signals.append("url")
    if "." in low and place < 2.5 and _HOST.search(core):
        place = max(place, 1.5)
        signals.append("host")
    if any(c.isdigit() for c in low):
        if _IP.search(low):
            place = max(place, 2.0)
            signals.append("ip")
        if _PORT.search(core):
            place = max(place, 2.0)
            signals.append("port")
    if "/" in core and _PATH.search(core):
        place = max(place, 1.5)
        signals.append("path")
    if "#" in core and _CHANNEL.search(low):
        place = max(place, 2.0)
        signals.append("channel")
    pointer = word_set & _POINTER_NOUNS
    if pointer:
        signals.append("pointer")
        where = _POINTER_PLACE.search(low)
        if where is not None:
            named = (
                place > 0
                or len(pointer) > 1
                or where.group(0).startswith(_STORED)
                or _NAMED.search(core) is not None
            )
            place += 1.5 if named else 1.0
        elif _POINTER_IS.search(core):
            place += 1.5
        else:
            place += 0.5
    weights["reference"] = place

    best = max(weights, key=lambda t: (weights[t], _PRIORITY[t]))
    if weights[best] < THRESHOLD:
        return None
    return _Reading(type=best, weight=weights[best], signals=signals)


_PRIORITY = {"feedback": 3, "reference": 2, "user": 1, "project": 0}


# --------------------------------------------------------------------------------------------
# Phrasing

# adverbs kept in front of the rewritten verb ("I really prefer" → "really prefers")
_REWRITE_ADVERB = (
    r"(?:really|strongly|much|generally|usually|definitely|mostly|mainly|personally|also"
    r"|always|kind of|normally|typically|often|still|just) "
)
_USER_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), replacement)
    for pattern, replacement in (
        (r"^(?:i|you)(?:'d| would) rather\b", "would rather"),
        (r"^(?:i|you)(?:'d| would) prefer\b", "would prefer"),
        (r"^(?:i|you)(?:'d| would) like\b", "would like"),
        (rf"^(?:i|you) ({_REWRITE_ADVERB})?(?:don't|do not) (\w+)", r"\1doesn't \2"),
        (r"^(?:i|you) can't stand\b", "can't stand"),
        (r"^(?:i|you) (?:can't|cannot|can not)\b", "can't"),
        (r"^(?:i(?:'m| am)|you(?:'re| are))\b", "is"),
        (r"^(?:i|you)(?:'ve| have)\b", "has"),
        (rf"^(?:i|you) ({_REWRITE_ADVERB})?(\w+)\b(?!')", ""),
        (r"^(?:my|your) ", ""),
    )
)
_FEEDBACK_REWRITE = re.compile(
    r"^(?:(?:i (?:want|need)|i(?:'d| would) like) you to |(?:you|we) (?:should|must|need to"
    r"|have to) (?=always|never|not|\w+)|(?:from now on|going forward|moving forward"
    r"|in (?:the )?future),? |(?:please|pls|kindly) )+",
    re.IGNORECASE,
)
_POLITE_TAIL = re.compile(r",? (?:please|pls|thanks|thank you)$", re.IGNORECASE)
_CONNECTOR_TAIL = re.compile(
    r"(?:[\s,;:—–(-]+(?:and|or|but|the|a|an|to|of|with|for|in|on|at|because|so|which|that"
    r"|when|if|as|by|from|than))*[\s,;:—–(-]*$",
    re.IGNORECASE,
)


def _third_person(verb: str) -> str:
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return f"{verb}es"
    if verb.endswith("y") and verb[-2:-1] not in ("a", "e", "o", "u"):
        return f"{verb[:-1]}ies"
    return f"{verb}s"


def _as_user(text: str) -> str:
    for pattern, replacement in _USER_REWRITES:
        match = pattern.match(text)
        if match is None:
            continue
        if replacement == "":
            if pattern.pattern.startswith("^(?:my"):
                return text[match.end() :]
            adverb, verb = match.group(1) or "", match.group(2)
            if verb.lower() in ("is", "was", "can", "will", "should", "must", "did", "do"):
                return text
            return f"{adverb}{_third_person(verb)}{text[match.end() :]}"
        return pattern.sub(replacement, text, count=1)
    return text


def _tidy(text: str) -> str:
    text = " ".join(text.split()).strip(" ,;:—–-")
    text = _POLITE_TAIL.sub("", text.rstrip(".!"))
    first, _, rest = text.partition(" ")
    if first and first[0].isupper() and first[1:2].islower() and first.lower() in _COMMON_FIRST:
        text = first[0].lower() + first[1:] + (f" {rest}" if rest else "")
    return text


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    head = text[: cut if cut > 0 else limit - 1]
    return _CONNECTOR_TAIL.sub("", head) + "…"


# --------------------------------------------------------------------------------------------
# Detection


def _importance(
    reading: _Reading, core: str, low: str, *, agent: bool
) -> tuple[Decimal, tuple[str, ...]]:
    signals = list(reading.signals)
    score = 0.3 + 0.05 * min(reading.weight - THRESHOLD, 2.0)
    explicit = [name for phrase, name in _EXPLICIT if phrase in low]
    if explicit:
        score += 0.25 + 0.05 * min(len(explicit) - 1, 2)
        signals.extend(explicit)
    specific = 0
    if any(c.isdigit() for c in MARKER.sub("", core)):
        specific += 1
        signals.append("number")
    if any(s in signals for s in ("url", "host", "ip", "port", "path", "channel")):
        specific += 1
    if "date" in signals:
        specific += 1
    if any(w[:1].isupper() and w[1:2].islower() for w in core.split()[1:] if w not in ("I",)) or (
        "`" in core or "_" in core
    ):
        specific += 1
        signals.append("name")
    score += 0.05 * min(specific, 3)
    if reading.type == "user" and "first_person" in signals:
        score += 0.1
    if any(h in low for h in _HEDGES):
        score -= 0.1
        signals.append("hedge")
    if agent:
        score *= AGENT_FACTOR
        signals.append("agent")
    score = min(max(score, 0.05), 0.95)
    return Decimal(f"{score:.3f}").quantize(THOUSANDTH), tuple(dict.fromkeys(signals))


def _says_enough(head: str, whole: str) -> bool:
    """A cut sentence still says something: five distinct words that carry meaning, and at
    least a third of the whole sentence's."""
    kept = {w for w in _words(head.lower()) if w not in _FILLER_WORDS and w not in _SMALL_TALK}
    every = {w for w in _words(whole.lower()) if w not in _FILLER_WORDS and w not in _SMALL_TALK}
    return len(kept) >= 5 and len(kept) * 3 >= len(every)


def _only_examples(sentence: str) -> bool:
    """Every credential in the sentence is an example ("never paste keys like …"), not one
    handed over ("here's my key …, don't store it")."""
    for marker in _CREDENTIAL_MARKER.finditer(sentence):
        if not _EXAMPLE_CUE.search(sentence[max(0, marker.start() - 30) : marker.start()]):
            return False
    return True


def _meaningful_words(text: str) -> int:
    return sum(1 for w in _words(MARKER.sub(" ", text).lower()) if w not in _FILLER_WORDS)


def _is_bare_correction(sentence: str) -> bool:
    """A sentence that only says "no, that's not right": the correction is in the next one."""
    words = _words(sentence.lower())
    return (
        0 < len(words) <= 7
        and all(w in _CORRECTION_WORDS for w in words)
        and any(w in ("no", "nope", "wrong", "incorrect", "not") for w in words)
    )


def _candidate(sentence: str, *, agent: bool, corrected: bool = False) -> Candidate | None:
    sentence = sentence.replace("’", "'").strip()
    low = sentence.lower()
    words = _words(low)
    if not words or _is_small_talk(words):
        return None
    if agent:
        commitment = _COMMITMENT.match(low)
        if commitment is None:
            return None
        body = sentence[commitment.end() :]
        subject = _AGENT_SUBJECT.match(body.lower())
        if subject is not None:
            body = body[subject.end() :]  # "I'll always answer in Spanish" → a rule
            if _LASTING.search(low[: commitment.end()]):
                body = f"from now on, {body}"  # the rule's "from now on" was in the prefix
        if not body.strip():
            return None
        sentence_core = body
        low = body.lower()  # the assistant's "I'll remember" is not the user's explicitness
    else:
        sentence_core = sentence
    if sentence_core.rstrip().endswith("?"):
        polite = _POLITE_RULE.match(sentence_core.lower())
        if polite is None:
            return None
        # "Could you always answer in Spanish from now on?" asks for a lasting rule
        sentence_core = sentence_core[polite.end() :].rstrip(" ?")
        low = sentence_core.lower()
    if any(p in low for p in _ONE_OFF) or _ONE_OFF_THIS.search(low):
        return None
    core_low = sentence_core.lower()
    correction = _CORRECTION_START.match(core_low)
    if correction is not None:
        sentence_core = sentence_core[correction.end() :]
    corrected = corrected or correction is not None or bool(_CORRECTION_CLAIM.match(core_low))
    filler = _FILLER.match(sentence_core.lower())
    if filler is not None:
        sentence_core = sentence_core[filler.end() :]
    comma = sentence_core.find(", ")
    if 0 < comma < 40 and _is_small_talk(_words(sentence_core[:comma].lower())):
        # "Good catch, and yes, always pin versions": the rule follows the pleasantry
        sentence_core = sentence_core[comma + 2 :]
        filler = _FILLER.match(sentence_core.lower())
        if filler is not None:
            sentence_core = sentence_core[filler.end() :]
    core_low = sentence_core.lower()
    core_words = _words(core_low)
    if not core_words or _is_small_talk(core_words) or _IDIOM.match(core_low):
        return None
    if core_words[0] in _QUESTION_START and sentence.rstrip().endswith("?"):
        return None
    reading = _read(sentence_core, core_low, core_words, corrected)
    if reading is None:
        return None
    kinds = sorted(set(MARKER.findall(sentence)))
    if kinds:
        credential = CREDENTIAL_KINDS.intersection(kinds)
        if credential and (reading.type != "feedback" or not _only_examples(sentence)):
            return None  # the point of the sentence is a secret, not a rule about secrets
        if _STATED_SECRET.search(sentence):
            return None  # "my email is …", "… is the test Visa we use"
        if _meaningful_words(sentence_core) < 3:
            return None
    content = _phrase(sentence_core, reading.type)
    if len(content) > MAX_CONTENT:
        short = _shorten(content, MAX_CONTENT)
        head = short[:-1]
        head_low = head.lower()
        again = _read(head, head_low, _words(head_low), corrected)
        if again is None or again.type != reading.type or not _says_enough(head, content):
            return None
        content = short
    if len(content.split()) < 2:
        return None
    importance, signals = _importance(reading, sentence_core, low, agent=agent)
    return Candidate(
        type=reading.type,
        content=content,
        importance=importance,
        source="agent_inferred" if agent else "user_stated",
        evidence=_shorten(" ".join(sentence.split()), MAX_EVIDENCE),
        redactions=kinds,
        signals=signals,
    )


def _phrase(core: str, type: str) -> str:
    text = _tidy(core)
    if type == "user":
        text = _as_user(text)
    elif type == "feedback":
        text = _FEEDBACK_REWRITE.sub("", text, count=1)
    return _tidy(text)


def detect(user_message: str, assistant_response: str = "") -> list[Candidate]:
    """Memory candidates in one turn, the user's first, each sentence at most once."""
    found: list[Candidate] = []
    seen: set[str] = set()
    for text, agent in ((user_message, False), (assistant_response, True)):
        if not text or not text.strip():
            continue
        if len(text) > MAX_SCAN:
            text = text[: max(text.rfind(" ", 0, MAX_SCAN), 0) or MAX_SCAN]  # whole words only
        redacted, _ = redact(text)
        corrected = False
        for sentence in _sentences(redacted):
            candidate = _candidate(sentence, agent=agent, corrected=corrected)
            corrected = not agent and _is_bare_correction(sentence)
            if candidate is None:
                continue
            key = normalize(candidate.content)
            if key in seen:
                continue
            seen.add(key)
            found.append(candidate)
    return found


def detect_many(turns: Iterable[str | tuple[str, str]]) -> list[list[Candidate]]:
    """`detect` over many turns: each a user message, or (user message, assistant reply)."""
    results: list[list[Candidate]] = []
    for turn in turns:
        if isinstance(turn, str):
            results.append(detect(turn))
        else:
            results.append(detect(turn[0], turn[1]))
    return results
