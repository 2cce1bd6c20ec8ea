"""Realistic corruptions of a document: what scraping and templating do to text.

:func:`corrupt` is the same function, with the same output for the same random generator, as
``pipeline.ablation.plan.corrupt`` (the ablation's positive control plants these kinds); it lives here, with no
import of its own, so that the quality stage can use it without importing the ablation (which imports the chain's
tasks, and so the quality stage: a circle).  The quality classifier's within-domain negatives use every kind but
the exact copy, plus :func:`boilerplate`.
"""

from __future__ import annotations

import random

JUNK_KINDS = ("exact_copy", "repeated_lines", "scrambled_words")
#: the ablation's positive control: the text corruptions, and a real page's template around the text
CONTROL_KINDS = (*JUNK_KINDS, "navigation")

#: lines of web navigation and boilerplate that :func:`boilerplate` puts around a text
BOILERPLATE = (
    "Home | About | Contact | Blog | Shop | Login", "Skip to main content", "Menu", "Search this site",
    "You are here: Home > Articles > Page", "Sign in | Register | My account | Cart (0)",
    "We use cookies to improve your experience. By continuing to browse you agree to our use of cookies.",
    "Accept all cookies | Manage preferences", "Share this: Facebook | Twitter | LinkedIn | Email | Print",
    "Related posts", "Subscribe to our newsletter", "Enter your email address", "Subscribe",
    "Copyright (c) 2024 All rights reserved.", "Privacy Policy | Terms of Use | Sitemap | Accessibility",
    "Previous | Next", "Back to top", "Leave a comment", "Posted in Uncategorized | Tagged news, update",
    "Follow us on social media", "Advertisement", "Powered by WordPress", "Page 1 of 3  1 2 3 Next >>",
    "Click here to read more", "Download the app", "Language: English | Deutsch | Francais | Espanol",
)


def corrupt(text: str, kind: str, rng: random.Random) -> list[str]:
    """The documents a planted one becomes: an exact copy beside it, every line four times, or its words shuffled
    within each line (a realistic failure: scraped text out of order)."""
    if kind == "exact_copy":
        return [text, text]
    if kind == "repeated_lines":
        return ["\n".join(line for line in text.split("\n") for _ in range(4))]
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        rng.shuffle(words)
        lines.append(" ".join(words))
    return ["\n".join(lines)]


def boilerplate(text: str, rng: random.Random) -> str:
    """The text between 3-7 lines of navigation and boilerplate before it and 2-5 after it (a page's template
    kept by the HTML extraction)."""
    head = rng.sample(BOILERPLATE, rng.randint(3, 7))
    tail = rng.sample(BOILERPLATE, rng.randint(2, 5))
    return "\n".join([*head, text, *tail])


def navigation(text: str, templates: list, rng: random.Random) -> str:
    """The text inside one real page's template: the lines its extraction dropped before and after the main
    content (``pipeline.ingest.templates``), the page chosen by ``rng``; with no templates (a corpus without HTML
    sources), :func:`boilerplate`'s lines."""
    if not templates:
        return boilerplate(text, rng)
    before, after = templates[rng.randrange(len(templates))]
    return "\n".join([*before, text, *after])
