"""The floor the worker is measured against: a bare pydantic-ai agent, written as a user would
write it without this product.

An OpenAI-compatible model through the OpenAI client, two plain function tools (search the corpus
file with sqlite3's FTS5 and show the results; record what the model cites), N questions run
concurrently on one event loop with an `asyncio.Semaphore` of C, no queue, no store, no
capabilities. It answers the same fake server, over the same corpus file, as the worker in
`bench/concurrency.py`, which runs this as a subprocess so that the CPU it reports is its own, as
the worker's is (the fake server lives in the benchmark process).

`python -m bench.bare_agent BASE_URL CORPUS_FILE CONCURRENCY JOBS` prints one JSON line:
`{"jobs", "wall_s", "cpu_s"}`, for the JOBS questions after a warm-up of CONCURRENCY questions.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field

from openai import AsyncOpenAI
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

SEARCH_SQL = """
SELECT c.id, d.title, c.content FROM chunks_fts f
JOIN chunks c ON c.seq = f.rowid JOIN documents d ON d.id = c.document_id
WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?
"""


@dataclass
class Cited:
    chunk_ids: list[str] = field(default_factory=list)


class Corpus:
    """One read-only connection per thread: pydantic-ai runs plain `def` tools in threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.local = threading.local()

    def search(self, query: str, limit: int) -> list[tuple[str, str, str]]:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = self.local.connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        words = re.findall(r"\w+", query)
        if not words:
            return []
        expression = " OR ".join(f'"{w}"' for w in words)
        return connection.execute(SEARCH_SQL, (expression, limit)).fetchall()


def build_agent(base_url: str, corpus: Corpus) -> Agent[Cited, str]:
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    model = OpenAIChatModel("fake-model", provider=OpenAIProvider(openai_client=client))
    agent: Agent[Cited, str] = Agent(model, deps_type=Cited, instructions="Answer from the knowledge base.")

    @agent.tool_plain
    def passages_search(query: str, limit: int = 5) -> str:
        """Search the knowledge base for passages relevant to the query."""
        rows = corpus.search(query, limit)
        if not rows:
            return "No results matched this query."
        return "\n\n-----\n\n".join(f'[{chunk_id}] [rank {rank} of {len(rows)}]\nSource: "{title}"\nContent:\n{text}'
                                    for rank, (chunk_id, title, text) in enumerate(rows, start=1))

    @agent.tool
    def passages_cite(ctx: RunContext[Cited], chunk_ids: list[str]) -> str:
        """Declare the chunk_ids that ground the answer."""
        ctx.deps.chunk_ids.extend(chunk_ids)
        return f"Recorded {len(chunk_ids)} citation(s)."

    return agent


async def run_all(agent: Agent[Cited, str], concurrency: int, jobs: int, tag: str) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            cited = Cited()
            result = await agent.run(f"When does the observatory open? ({tag} {i})", deps=cited)
            assert result.output and cited.chunk_ids, "the bare agent did not cite"

    await asyncio.gather(*(one(i) for i in range(jobs)))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main(base_url: str, corpus_file: str, concurrency: int, jobs: int) -> dict[str, float]:
    agent = build_agent(base_url, Corpus(corpus_file))
    await run_all(agent, concurrency, concurrency, "warmup")
    cpu, wall = cpu_seconds(), time.perf_counter()
    await run_all(agent, concurrency, jobs, "timed")
    return {"jobs": jobs, "wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu}


if __name__ == "__main__":
    url, path, c, n = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(url, path, int(c), int(n)))))
