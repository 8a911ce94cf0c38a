"""A parsed HTML page for the report tests (html.parser): its sections, layer sections, table
rows as cell texts, every URL in src/href, and a count of each tag."""
from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """Sections, table rows (cell texts), URLs in src/href, counts of svg and script tags."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.layers: list[str] = []
        self.rows: list[list[str]] = []
        self.urls: list[str] = []
        self.tags: dict[str, int] = {}
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k in ("src", "href", "xlink:href"):
            if k in a:
                self.urls.append(a[k])
        if tag == "details" and "data-section" in a:
            self.sections.append(a["data-section"])
        if tag == "details" and "data-layer" in a:
            self.layers.append(a["data-layer"])
        if tag == "tr":
            self._row = []
        if tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse(text: str) -> Page:
    p = Page()
    p.feed(text)
    return p
