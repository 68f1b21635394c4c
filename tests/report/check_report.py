#!/usr/bin/env python3
"""Checks a kiln report.html: well-formed (every element closed, properly
nested), self-contained (no script, no external reference) and holding the
expected plot series (the data-series attributes of its SVGs).

    check_report.py REPORT.html SERIES...

Each SERIES must be among the names of some <svg data-series="a,b">.
Exits 1 with a message on the first problem."""
import sys
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "hr", "input", "link"}
SVG_LEAF_OK = {"rect", "circle", "line", "polyline", "path"}


class Check(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.series, self.errors = [], [], []
        self.svgs = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.errors.append("the page has a <script>")
        for k, v in attrs:
            if k in ("src", "href") or (v and ("http://" in v or "https://" in v)
                                         and k != "xmlns"):
                self.errors.append(f"external reference {k}={v!r} on <{tag}>")
        if tag == "svg":
            self.svgs += 1
            self.series.extend(s for s in (a.get("data-series") or "").split(",") if s)
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        # <rect .../>: an element opened and closed at once
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if not self.stack:
            self.errors.append(f"</{tag}> closes nothing at line {self.getpos()[0]}")
            return
        top, pos = self.stack.pop()
        if top != tag:
            self.errors.append(f"</{tag}> at line {self.getpos()[0]} closes <{top}> "
                               f"opened at line {pos[0]}")


def main():
    path, want = sys.argv[1], sys.argv[2:]
    text = open(path, encoding="utf-8").read()
    if not text.startswith("<!DOCTYPE html>"):
        sys.exit(f"{path}: no <!DOCTYPE html>")
    c = Check()
    c.feed(text)
    c.close()
    if c.stack:
        c.errors.append("unclosed: " + ", ".join(f"<{t}> line {p[0]}" for t, p in c.stack))
    for s in want:
        if s not in c.series:
            c.errors.append(f"no plot series {s!r} (have {c.series})")
    if c.errors:
        sys.exit(f"{path}: " + "; ".join(c.errors[:5]))
    print(f"{path}: well-formed, {c.svgs} plots, series {c.series}")


main()
