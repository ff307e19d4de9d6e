"""plotly.js's own styles as a static stylesheet, for pages under a strict Content-Security-Policy.

plotly.js writes its base rules (the modebar, the hover layer, the notifier) into a <style>
element it adds to the page, which `style-src 'self'` forbids; when an element with the id
`plotly.js-style-global` and the class `no-inline-styles` is already there, it writes none and
leaves the rules to that stylesheet. This makes that stylesheet from the installed bundle:
the same rules, in the order plotly.js would have inserted them (each at the front).

The bundled map library (maplibre) adds its own <style> at load unless an element with the id
it checks is there: no page draws a map, so its 83 KB of rules are not shipped, and an empty
<template> with that id stands in. Both elements are the partial this writes beside the CSS.

    python -m devtools.plotly_css  # writes static/costboard/plotly.css and the partial

tests/costboard/test_csp.py checks that both match the installed plotly.js.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import plotly

BUNDLE = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "static" / "costboard" / "plotly.css"
PARTIAL = ROOT / "templates" / "costboard" / "_plotly_styles.html"

# the rules' object literal: {"X,X div":'…',"X input,…":"…",…};for(… in …)…addStyleRule(…)
_RULES = re.compile(r'=\{("X,X div":.*?)\};for\(\w+ in \w+\)', re.DOTALL)
_STRING = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""
_PAIR = re.compile(rf"({_STRING}|[A-Za-z_$][\w$]*):({_STRING}),?")  # a key may be a bare name


def _text(literal: str) -> str:
    if literal[0] not in "'\"":
        return literal
    return literal[1:-1].replace("\\'", "'").replace('\\"', '"')


def plotly_rules(bundle: str) -> list[tuple[str, str]]:
    """(selector, declarations) as plotly.js's addStyleRule loop makes them, in its order."""
    found = _RULES.search(bundle)
    if found is None:
        raise ValueError("plotly.js's style rules were not found in the bundle")
    rules = []
    position = 0
    body = found.group(1)
    while position < len(body):
        pair = _PAIR.match(body, position)
        if pair is None:
            raise ValueError(f"unexpected text in plotly.js's style rules: {body[position:][:60]}")
        key, value = _text(pair.group(1)), _text(pair.group(2))
        selector = re.sub("^,", " ,", key).replace("X", ".js-plotly-plot .plotly")
        rules.append((selector.replace("Y", ".plotly-notifier"), value))
        position = pair.end()
    return rules


def plotly_css(bundle: str, version: str) -> str:
    header = (
        f"/* plotly.js {version}'s base styles, made by devtools/plotly_css.py from the bundle:\n"
        " * what it would write into a <style> element, which the pages' CSP forbids. */\n"
    )
    # each rule went in at index 0: the last one made comes first
    return header + "".join(f"{s}{{{d}}}\n" for s, d in reversed(plotly_rules(bundle)))


# an element id checked before a <style> is made: `if(!document.getElementById("<id>")){…
# createElement("style")`
_GUARDED_STYLE = re.compile(
    r'if\(!document\.getElementById\("([^"]+)"\)\)\{var \w+=document\.createElement\("style"\)'
)


def guarded_style_ids(bundle: str) -> list[str]:
    """The ids whose element, when present, stops the bundle adding a <style> of its own."""
    return _GUARDED_STYLE.findall(bundle)


def plotly_partial(bundle: str) -> str:
    stand_ins = "".join(f'<template id="{i}"></template>' for i in guarded_style_ids(bundle))
    return (
        "{% load static %}{# made by devtools/plotly_css.py: plotly.js finds its styles "
        "here and writes no <style> (the pages' CSP forbids it); the templates stand in for "
        "the map styles no page needs #}\n"
        '<link rel="stylesheet" href="{% static \'costboard/plotly.css\' %}" '
        'id="plotly.js-style-global" class="no-inline-styles">' + stand_ins + "\n"
    )


def bundle_version(bundle: str) -> str:
    found = re.search(r"plotly\.js v([\w.-]+)", bundle[:400])
    return found.group(1) if found else "?"


def main() -> None:
    bundle = BUNDLE.read_text(encoding="utf-8")
    OUTPUT.write_text(plotly_css(bundle, bundle_version(bundle)), encoding="utf-8")
    PARTIAL.write_text(plotly_partial(bundle), encoding="utf-8")
    sys.stdout.write(f"wrote {OUTPUT} and {PARTIAL}\n")


if __name__ == "__main__":
    main()
