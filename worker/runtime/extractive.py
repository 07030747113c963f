"""The built-in offline `extractive` model: deterministic, no network, no weights.

It drives the same agent loop a real model does (search, cite, answer), so the embedded demo and
smoke tests exercise the real capabilities, policy and results path. It searches with the question,
cites the passages whose sentences overlap the question enough (or declares none), and answers
with those sentences, or says the answer was not found.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from capabilities import NO_RESULTS, RESULT_SEPARATOR

EXTRACTIVE = "extractive"
SEARCH_TOOL = "passages_search"
CITE_TOOL = "passages_cite"
NOT_FOUND = "The answer was not found in the knowledge base."
MIN_OVERLAP = 0.6  # share of the question's content words a sentence must contain to support an answer
_REDIRECT_MARK = "[cite-request v1 "
_STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be been before being below between both but by
    can could did do does doing down during each few for from further had has have having he her here hers him his
    how i if in into is it its itself just me more most my no nor not now of off on once only or other our ours out
    over own same she should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with would you your yours
    tell explain describe please know show give list many much does did must can may might shall should""".split()
)


def terms(text: str) -> set[str]:
    """Content words, lower-cased, with a plural `s` dropped so "masks" meets "mask"."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in words if w not in _STOPWORDS and (len(w) > 2 or w.isdigit())}


def sentences(text: str) -> list[str]:
    pieces = re.split(r"(?<=[.!?])\s+|\n+", text)
    return [p.strip().lstrip("#>*- ").strip() for p in pieces if len(p.strip()) > 3]


@dataclass(frozen=True)
class Passage:
    chunk_id: str
    rank: int
    content: str


def parse_results(text: str) -> list[Passage]:
    """The passages of one `passages_search` return, as `capabilities.formatting` renders them."""
    if text.strip() == NO_RESULTS:
        return []
    passages = []
    for rank, block in enumerate(text.split(RESULT_SEPARATOR)):
        head = re.match(r"\s*\[([^\]]+)\]", block)
        if head is None:
            continue
        _, _, content = block.partition("\nContent:\n")
        passages.append(Passage(head.group(1), rank, content or block))
    return passages


@dataclass(frozen=True)
class Support:
    chunk_id: str
    sentence: str
    score: float


def supporting(question: str, passages: Sequence[Passage], *, min_overlap: float, max_sentences: int) -> list[Support]:
    """Sentences sharing enough of the question's content words; the best first, earlier ranks on ties.
    Questions of two or more words need two shared words, so one common word does not ground an answer."""
    wanted = terms(question)
    if not wanted:
        return []
    need = max(min(2, len(wanted)), math.ceil(min_overlap * len(wanted)))
    found: list[tuple[float, int, int, Support]] = []
    seen: set[str] = set()
    for passage in passages:
        for position, sentence in enumerate(sentences(passage.content)):
            shared = wanted & terms(sentence)
            if len(shared) >= need and sentence not in seen:
                seen.add(sentence)
                score = len(shared) / len(wanted)
                found.append((-score, passage.rank, position, Support(passage.chunk_id, sentence, score)))
    found.sort(key=lambda item: item[:3])
    return [item[3] for item in found[:max_sentences]]


def _text_of(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "\n".join(item for item in part.content if isinstance(item, str))


def _question(messages: Sequence[ModelMessage]) -> tuple[int, str]:
    """The latest user prompt that is not our redirect, and where it sits."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and _REDIRECT_MARK not in _text_of(part):
                    return index, _text_of(part)
    return 0, ""


def next_parts(
    messages: Sequence[ModelMessage],
    offered: frozenset[str],
    *,
    min_overlap: float = MIN_OVERLAP,
    max_sentences: int = 3,
) -> list[ModelResponsePart]:
    """Search once, cite once, then answer: each step decided from the messages alone."""
    start, question = _question(messages)
    after = messages[start + 1 :]
    calls = [p for m in after if isinstance(m, ModelResponse) for p in m.parts if isinstance(p, ToolCallPart)]
    returns = [p for m in after if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    if SEARCH_TOOL in offered and not any(c.tool_name == SEARCH_TOOL for c in calls):
        return [ToolCallPart(SEARCH_TOOL, {"query": question})]
    passages = [p for r in returns if r.tool_name == SEARCH_TOOL for p in parse_results(r.model_response_str())]
    support = supporting(question, passages, min_overlap=min_overlap, max_sentences=max_sentences)
    if CITE_TOOL in offered and not any(c.tool_name == CITE_TOOL for c in calls):
        chunk_ids = list(dict.fromkeys(s.chunk_id for s in support))
        return [ToolCallPart(CITE_TOOL, {"chunk_ids": chunk_ids})]
    if not support:
        return [TextPart(NOT_FOUND)]
    return [TextPart(" ".join(s.sentence for s in support))]


def _words(messages: Sequence[ModelMessage | ModelResponse]) -> int:
    total = 0
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None) or getattr(part, "args", None) or ""
            total += len(str(content).split())
    return total


class ExtractiveModel(Model):
    """A pydantic-ai model that reads the passages it is shown instead of generating text."""

    def __init__(self, *, min_overlap: float = MIN_OVERLAP, max_sentences: int = 3) -> None:
        super().__init__()
        self.min_overlap, self.max_sentences = min_overlap, max_sentences

    @property
    def model_name(self) -> str:
        return EXTRACTIVE

    @property
    def system(self) -> str:
        return "grounded"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        model_settings, params = self.prepare_request(model_settings, model_request_parameters)
        if not params.allow_text_output:
            raise UserError("the extractive model answers in text; remove output_schema from the agent spec")
        offered = frozenset(t.name for t in params.declared_function_tools)
        parts = next_parts(messages, offered, min_overlap=self.min_overlap, max_sentences=self.max_sentences)
        response = ModelResponse(parts=parts, model_name=EXTRACTIVE)
        response.usage = RequestUsage(input_tokens=_words(messages), output_tokens=_words([response]))
        return response
