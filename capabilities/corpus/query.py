"""Turning free text from users and models into an FTS5 match expression that cannot fail.

FTS5 has its own query language (AND, OR, NOT, NEAR, quotes, `*`, `^`, `col:`), and a model
writing "a AND (" or a user pasting `"quoted` would otherwise get a syntax error instead of
results. So the query is never passed through: it is cut into words, and each word becomes a
quoted string, which FTS5 reads as plain text whatever it contains.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+(?:[.\-]\w+)*")
"""A word, keeping joined forms like `6.43` or `e-mail` whole: FTS5 then matches them as a
phrase of their parts, which is what the reader meant. Colons, slashes and apostrophes split
words (`content:mirror`, `and/or`, `mirror's`), so a stray one cannot make a phrase that no
text contains."""

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own s same she should so some such t than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)
"""Words that occur in nearly every chunk: they add almost nothing to BM25 ranking but make an
OR query visit every row, so they are dropped from queries that have other words."""


def content_words(query: str) -> list[str]:
    """The distinct non-stopwords of a query, lower-cased, in order."""
    return list(dict.fromkeys(w for w in (word.lower() for word in _WORD.findall(query)) if w not in STOPWORDS))


def match_expression(query: str) -> str | None:
    """An FTS5 expression for a query, or None when the query has no words.

    Chunks containing any of the query's content words: BM25 then ranks chunks with more, and
    rarer, of them first. OR rather than AND because a natural-language question rarely has all
    its words in the passage that answers it. A query of stopwords only ("the who", "what is
    it") is matched as a phrase: any one of its words is in nearly every chunk, so only the
    exact sequence says something.
    """
    words = content_words(query)
    if words:
        return " OR ".join(f'"{word}"' for word in words)
    every_word = [word.lower() for word in _WORD.findall(query)]
    return f'"{" ".join(every_word)}"' if every_word else None
