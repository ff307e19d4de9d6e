"""The cues detect reads a sentence by: the words, phrases and patterns that make it a rule, a
correction, a preference, a background fact, a deadline or ongoing work, a pointer (a URL, a
host, a path, a channel), a commitment of the agent's, or small talk, a hedge or a one-off to
drop. Data only (no logic but `wordset`): memory_ui.detect weighs them.

Everything is precompiled; the regexes use possessive quantifiers and bounded repeats (no
catastrophic backtracking).
"""

from __future__ import annotations

import re

from memory_ui.redaction import CREDENTIAL_KINDS, KINDS


def wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


WORD = re.compile(r"[a-z0-9][a-z0-9'_-]*")
SMALL_TALK = wordset(
    """hi hello hey yo thanks thank thx ty ok okay k cool great nice awesome perfect lol lmao
    haha hah hehe sure yes yeah yep no nope nah got it sounds good fine bye goodbye cheers
    morning night evening afternoon how are is it going what's whats up sup np problem welcome
    you're wow oops hmm ah oh ugh one well done job lgtm ship agreed exactly right true fair
    enough makes sense love amazing brilliant wonderful excellent neat sweet alright all that's
    that this works worked so much very a lot for the help again and have day you your man
    dude there appreciate appreciated it's looks good! all set deal kk catch point idea"""
)
ONE_OFF = (
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
ONE_OFF_THIS = re.compile(
    r"\b(?:for|in|on) this (?:one|task|answer|reply|response|question|message|session|file"
    r"|function|email|ticket|pr|draft|run|chart|table|paragraph|document|query|slide|post"
    r"|thread|case|call|page)\b(?! (?:and|or) (?:all|every|future))"
)
QUESTION_START = wordset(
    "what what's whats how why when where who whom which is are can could would will do does "
    "did should shall may might have has"
)
HEDGES = ("maybe", "perhaps", "probably", "i think", "i guess", "might", "not sure", "kind of")
EXPLICIT = (
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
GENERALIZERS = wordset(
    """all every any always never whenever default instead consistently everywhere future
    anymore only each generally unless"""
)
GENERAL_PHRASES = (
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
RESPONSE_NOUNS = wordset(
    "answers replies responses explanations summaries examples suggestions messages"
)
DATE_VERBS = wordset(
    """by until before every each starts start ends end moved moves begins closes opens
    expires renews"""
)
DETERMINERS = wordset(
    """the this that these those my your our their his her its it a an some me us him them
    one two three four five again"""
)
CONDITIONS = wordset("before after when whenever once until if")
IMPERATIVES = wordset(
    """use prefer write keep put run add avoid call name format reply answer respond stick
    switch make include cite quote send post check follow default set pin open create commit
    push merge deploy test document comment log store save mention explain give show list sort
    treat assume address greet sign end start begin label tag ask let wrap split return raise
    handle prefix suffix indent type lint refer link ping notify skip omit drop remove ignore
    leave double-check verify escalate"""
)
FEEDBACK_PHRASES = (
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
CORRECTION_START = re.compile(
    r"^(?:(?:no|nope|nah|actually|wrong|incorrect|not quite|not really|that's (?:wrong|not right"
    r"|incorrect|not correct|not what i (?:asked|meant|wanted))|that is (?:wrong|not right"
    r"|incorrect)|you're wrong|correction)\b[\s,:;.!-]*){1,4}+(?=\S)"
)
# "I asked for Python, not JavaScript!"
CORRECTION_CLAIM = re.compile(
    r"^i (?:asked for|said|meant|told you|wanted|need(?:ed)?)\b[^.]{0,80}?,? (?:not|instead of"
    r"|rather than)\b"
)
CORRECTION_WORDS = wordset(
    "hmm hm no nope that's that is not right wrong incorrect correct quite it's actually ugh"
)
RULE_START = re.compile(
    r"^(?:(?:please|pls|kindly)\s+)?(?:always|never|don't|dont|do not|avoid|only)\b"
    r"|^(?:(?:please|pls)\s+)?stop \w+ing\b"
    r"|^(?:you|we)(?: should| must| need to| have to|'ll| will)?(?: always| never| not)\b"
    r"|^(?:you|we) (?:should|must|need to|have to) (?:\w+ ){0,6}?(?:all|every|any|each|only)\b"
    r"|[,;:—–]\s*(?:(?:please|and|but)\s+)?(?:always|never|don't|do not)\s+[a-z]"
)
ADVERB = (
    r"(?:really |strongly |much |generally |usually |definitely |mostly |mainly |personally "
    r"|also |always |kind of |tend to |normally |typically |often |still |just )?"
)
FIRST_PERSON_PREFERENCE = re.compile(
    rf"\b(?:i|you)(?:'d| would)? {ADVERB}(?:prefer|rather|like|love|hate|dislike"
    r"|enjoy|favou?r|can't stand|cannot stand|don't like|do not like|don't want|do not want"
    r"|want|need|find)s?\b( (?:(?:it|that|this|these|those|your|the idea)\b(?! when\b| if\b)"
    r"|the (?:first|second|third|last|other|former|latter|previous|new|old|original)\b|both\b"
    r"|option \w+|(?:this|that|the) (?:one|version|option|approach|draft)\b))?"
)
STYLE_NOUNS = wordset(
    """answers answer responses response replies reply explanations explanation examples code
    summaries summary output comments comment messages emails reports units format formatting
    bullet bullets points tables language tone style docstrings tests variable variables names
    citations sources links diagrams charts plots short shorter long longer concise brief
    detailed plain simple metric imperial english spanish french german dark light mode
    emoji emojis markdown type hints hints spaces tabs numbers dates"""
)
BACKGROUND = re.compile(
    r"\b(?:(?:i(?:'m| am)|you(?:'re| are)) (?:a|an|the)\b(?! (?:bit|little|lot|few|big fan)\b)"
    r"|(?:i(?:'m| am)|you(?:'re| are)) (?:new to|not (?:a|an) |not familiar|familiar with"
    r"|based in|located in"
    r"|colou?r[- ]?blind|vegetarian|vegan|left-handed|dyslexic|deaf|blind|fluent in|allergic)"
    r"|i (?:work|am working) (?:as|at|for|in|on the \w+ team|with)\b"
    rf"|i (?:live|am based) in\b|i {ADVERB}(?:speak|code in|write in|write|use|work in) "
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
DEADLINE_WORDS = wordset(
    """deadline deadlines due eta milestone cutoff cut-off freeze go-live kickoff kick-off
    launch launches launching release releases releasing ship ships shipping demo demos
    sprint roadmap meeting review interview conference workshop offsite audit presentation
    submission exam defense renewal trip vacation holiday onsite deprecated deprecate sunset
    eol end-of-life"""
)
STRONG_DEADLINE = wordset("deadline deadlines due eta milestone cutoff cut-off freeze")
MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
DATE = re.compile(
    rf"\b(?:{MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{MONTH}"
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
PROJECT_NOUNS = (
    r"(?:stack|backend|frontend|app|apps|service|services|api|database|project|product|codebase"
    r"|repo|pipeline|infra|infrastructure|team|client|customer|migration|budget|sla|slas"
    r"|policy|process|target|goal|goals|quota|limit|plan|pricing|convention|conventions|customers|users|clients"
    r"|workflow|release cycle|on-call|rotation|standup|study|paper|thesis|experiment)"
)
ONGOING = re.compile(
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
    rf"|\bour {PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:is|are|runs|uses|targets|wants|needs"
    r"|depends|moved|has|requires|supports)\b"
    rf"|\bthe {PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:runs|uses|targets|wants|needs|depends"
    r"|moved|has to|must|requires|supports|is due|is built|is written)\b"
    rf"|\bthe {PROJECT_NOUNS}\b(?: [\w-]+){{0,4}}? (?:is|are) (?:[\w$€£~-]+ ){{0,2}}?\d"
    r"|\bdeploy target\b|\bdeploys? to\b|\bis deployed (?:on|to)\b"
)
URL = re.compile(r"\b(?:https?|s3|gs|ftp)://[^\s<>\"']{2,2000}+|\bwww\.[^\s<>\"']{2,2000}+")
HOST = re.compile(
    r"\b(?:[a-z0-9](?:[a-z0-9-]{0,62}+)\.){1,6}(?:com|io|dev|net|org|internal|local|lan"
    r"|cloud|app|ai|co|corp|int|svc|so|sh|us|eu|uk|de|fr|xyz|tech|site|page)\b(?:/[^\s]*+)?"
    r"|\blocalhost\b",
    re.IGNORECASE,
)
IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")
PORT = re.compile(
    r"\bport \d{2,5}\b|\b[a-z][\w.-]{0,253}+(?<!\.):\d{2,5}\b"
    r"|\b(?:listens?|listening|runs?|running|served"
    r"|serves?|exposed|binds?|bound|available) on (?!(?:19|20)\d\d\b)\d{2,5}\b"
    r"|\b(?:is|are|replica|replicas) on (?!(?:19|20)\d\d\b)\d{4,5}\b",
    re.IGNORECASE,
)
PATH = re.compile(
    r"(?<![\w.])(?:~|\.{1,2})?/[\w.-]{1,100}+(?:/[\w.-]{1,100}+)*+"
    r"|\b[\w-]{1,100}+(?:/[\w.-]{1,100}+)*+\.(?:md|py|yaml|yml|json|toml|txt|ts|js|sql|sh|cfg"
    r"|ini|env|ipynb|pdf|csv|html|rst)\b"
    r"|\b[\w.-]{1,100}+(?:/[\w.-]{1,100}+){2,}+"
)
CHANNEL = re.compile(r"(?<![\w&])#[a-z][\w-]{2,80}+")
POINTER_NOUNS = wordset(
    """docs doc documentation runbook runbooks wiki confluence notion dashboard dashboards
    grafana sentry jira readme playbook handbook spreadsheet sheet channel repo repository
    endpoint bucket vault kibana datadog figma drive folder page spec specs postman swagger
    knowledge kb gitlab github server host cluster database db registry status pagerduty
    opsgenie linear asana trello airtable dropbox sharepoint onedrive gdrive bitbucket
    artifactory metabase looker tableau superset jupyterhub colab overleaf zotero arxiv
    brokers broker warehouse lake queue topic index bigquery snowflake redshift"""
)
POINTER_PLACE = re.compile(
    r"\b(?:(?:is|are|lives?|sits?|stored|kept|hosted|located|found|published|documented"
    r"|posted|tracked|listens|runs|linked|pinned) (?:at|in|on|under|from)|go(?:es)? to"
    r"|(?:see|check|consult) the)\b"
)
STORED = (
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
POINTER_IS = re.compile(r"\b(?:is|are) (?:the |our |a |an )?(?:[A-Z][\w-]+|`[^`]+`)")
NAMED = re.compile(r"['\"`“‘]\w|\s[A-Z][\w-]*")
COMMITMENT = re.compile(
    r"^(?:(?:ok(?:ay)?|sure|got it|understood|of course|absolutely|will do|great|thanks"
    r"|perfect|done)\b[\s,.:;!—–-]*)*"
    r"(?:noted|i(?:'ll| will) (?:remember|keep in mind|make a note|note)(?: that)?"
    r"|i(?:'ve| have) (?:noted|saved|recorded|stored|remembered)(?: that)?"
    r"|(?:saved|stored) (?:to|in) (?:my )?memory|remembered"
    r"|(?:from now on|going forward|in (?:the )?future),? (?=i(?:'ll| will) )"
    r"|(?=i(?:'ll| will) (?:always|never|no longer|stop) ))"
    r"[\s,.:;!—–-]*"
)
POLITE_RULE = re.compile(
    r"^(?:(?:can|could|would|will) you (?:please )?)(?=.*\b(?:always|never|from now on"
    r"|going forward|in (?:the )?future|by default)\b)"
)
LASTING = re.compile(r"\b(?:from now on|going forward|in (?:the )?future)\b")
AGENT_SUBJECT = re.compile(r"^(?:from now on,? |going forward,? )?i(?:'ll| will) ")
FILLER = re.compile(
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
STATED_SECRET = re.compile(
    r"(?:\b(?:is|was|are)|[:=])\s*[\"'`]?\[redacted:\w+\]|^\W*\[redacted:\w+\]\W* (?:is|was|are)\b"
)
CREDENTIAL_MARKER = re.compile(rf"\[redacted:(?:{'|'.join(sorted(CREDENTIAL_KINDS))})\]")
EXAMPLE_CUE = re.compile(
    r"\b(?:like|such as|e\.g\.|for example|for instance|including)\W+(?:[\w-]+\W+)?$",
    re.IGNORECASE,
)
FILLER_WORDS = wordset(
    """password passwd passphrase pwd key keys api token tokens secret secrets email mail
    address phone number mobile cell card credit debit iban account login credentials my our
    your his her is was are the a an here here's it's its this that for of to at on in use
    using and or new current old aws openai anthropic github slack stripe google bearer jwt
    header authorization auth just so you know fyi btw i me reach contact call text via with
    like be can is are am it if please redacted"""
) | frozenset(KINDS)
COMMON_FIRST = wordset(
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


IDIOM = re.compile(
    r"^(?:never ?mind|don't worry|do not worry|no worries|don't mention it|always happy"
    r"|always a pleasure|never again|never heard|always fun|never a dull)\b"
)
# past events are not upcoming work: "the deadline was yesterday"
PAST = re.compile(r"\b(?:yesterday|last (?:week|month|year|quarter|sprint|time)|ago)\b")
