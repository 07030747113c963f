"""The MCP server (official `mcp` SDK): tools that ask the knowledge base through the queue, search
it, and submit and read batches. Transport-independent: `grounded mcp` serves it over stdio, and
the API mounts it at `/mcp` (streamable HTTP) behind its bearer tokens.

Every tool acts for one tenant, which the transport supplies (`tenant_of`): the CLI tenant on
stdio, the bearer token's tenant over HTTP (I5). Configs are the operator's, chosen by name (I1).
A tool that cannot do what it was asked raises an MCP error carrying the API's message for the
same request, with the API's status and detail as its data (I7).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import Field

from capabilities.corpus import NotACorpusError
from worker.jobs.composition import CompositionError
from worker.jobs.lines import BatchReport
from worker.jobs.models import JobConfig, JobResult
from worker.jobs.served import BrokenConfig, UnknownConfig
from worker.producer import NotFound, Producer
from worker.store.outages import REDIS_UNAVAILABLE, unavailable

from .grounding import answer_text, grounding_view, result_view
from .search import MAX_HITS, CorpusSearch, SearchUnavailable

TenantOf = Callable[[Context], str]
P = ParamSpec("P")
T = TypeVar("T")

MAX_ASK_WAITERS = 100
MAX_ASK_WAIT_S = 600.0
MAX_RESULTS_PAGE = 100
INSTRUCTIONS = (
    "Answers questions over this deployment's document corpus. Every answer declares what grounds it: "
    "a citation status (grounded, ungrounded or missing) and the cited passages with their document and page. "
    "Use `ask` for one question, `search` to see passages yourself, and `submit_batch` / `batch_status` / "
    "`batch_results` for many questions at once."
)


def refused(status: int, message: str, detail: Any = None) -> MCPError:
    """I7: the API's message, and its HTTP status and detail as data, so a client can tell a 404 from a 422."""
    return MCPError(INVALID_PARAMS if status < 500 else INTERNAL_ERROR, message,
                    {"status": status, "detail": message if detail is None else detail})


def rejected(report: BatchReport, *, single: bool = False) -> MCPError:
    """A refused batch, line by line as the API's 422 lists it; nothing was enqueued."""
    problems = [e.problem if single and e.line_no else str(e) for e in report.errors]
    return refused(422, "; ".join(problems) + ("" if single else "; nothing was enqueued"),
                   [e.as_dict() for e in report.errors])


async def blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Redis and SQLite calls are blocking, so they run in a thread."""
    return await in_thread(functools.partial(fn, *args, **kwargs))


async def in_thread(call: Callable[[], T], limiter: anyio.CapacityLimiter | None = None) -> T:
    """`call` on a thread (of `limiter`'s pool for one that may block for long, so it never takes
    the threads every other call shares); a store that is down is an MCP error with the API's 503
    message, not a crash the client cannot read."""
    try:
        return await anyio.to_thread.run_sync(call, limiter=limiter)
    except REDIS_UNAVAILABLE as exc:
        raise refused(503, unavailable(exc)) from None
    except NotFound as exc:
        raise refused(404, str(exc)) from None


def served(producer: Producer, name: str | None) -> tuple[str, JobConfig]:
    try:
        return producer.served_config(name)
    except UnknownConfig as exc:
        raise refused(422, str(exc)) from None
    except BrokenConfig as exc:
        raise refused(503, str(exc)) from None


def create_mcp_server(producer: Producer, tenant_of: TenantOf) -> MCPServer:
    server: MCPServer = MCPServer("grounded", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING")
    waiters = anyio.CapacityLimiter(MAX_ASK_WAITERS)  # `ask`s waiting for their answer, each on a thread
    searcher = CorpusSearch.from_settings(producer.settings)

    def submit(tenant: str, lines: list[Any], config: JobConfig, *, single: bool = False) -> str:
        report = producer.validate(lines, config, tenant=tenant)
        if not report.ok:
            raise rejected(report, single=single)
        return producer.submit(report, tenant=tenant).id

    @server.tool()
    async def ask(
        ctx: Context,
        question: Annotated[str, Field(description="the question, in the user's words")],
        config: Annotated[str | None, Field(description="a served config's name; default: the server's")] = None,
        timeout_s: Annotated[float, Field(gt=0, le=MAX_ASK_WAIT_S, description="seconds to wait")] = 120.0,
    ) -> dict[str, Any]:
        """Ask one question of the knowledge base through the queue and wait for the answer. Returns the
        answer, its citation status and the citations (document, page, chunk id). A single-shot question:
        it carries no history, so nothing earlier is compacted (H1)."""
        tenant = tenant_of(ctx)
        name, job_config = served(producer, config)
        line = {"custom_id": "mcp-ask", "question": question}
        batch_id = await blocking(submit, tenant, [line], job_config, single=True)
        [job_id] = await blocking(producer.store.job_ids, batch_id)
        result = await in_thread(functools.partial(producer.store.wait_result, job_id, batch_id, timeout_s), waiters)
        base = {"batch_id": batch_id, "job_id": job_id, "config": name}
        if result is None:
            return {**base, "status": "running",
                    "message": f"no answer after {timeout_s:g} s; batch_results({batch_id!r}) shows it once it is ready"}
        if result.status == "failed" or not result.turns:
            return {**base, "status": "failed", "error": result.error.model_dump() if result.error else None}
        turn = result.turns[-1]
        return {**base, "status": "succeeded", "answer": answer_text(turn.answer), **grounding_view(turn)}

    @server.tool()
    async def search(
        ctx: Context,
        query: Annotated[str, Field(description="words to look for")],
        corpus: Annotated[str | None, Field(description="a served corpus; default: the only one you may search")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_HITS)] = 5,
    ) -> dict[str, Any]:
        """Search a corpus directly, as a job's passage search would (BM25, or hybrid for a corpus
        with vectors): each hit with its document, page, heading path and score."""
        tenant = tenant_of(ctx)
        available = producer.served_corpora(tenant)  # H13: only the corpora this tenant may name
        try:
            hits = await searcher.search(corpus, query, limit=limit, available=available or [])
        except CompositionError as exc:
            raise refused(422, str(exc)) from None
        except (SearchUnavailable, NotACorpusError) as exc:
            raise refused(503, str(exc)) from None
        return {"query": query, "hits": [hit.model_dump() for hit in hits]}

    @server.tool()
    async def submit_batch(
        ctx: Context,
        lines: Annotated[list[dict[str, Any] | str], Field(
            description="one job each: {custom_id, question} or {custom_id, turns: [...]}, as a JSONL line holds it")],
        config: Annotated[str | None, Field(description="a served config's name; default: the server's")] = None,
    ) -> dict[str, Any]:
        """Validate every line and queue the batch; a bad line refuses the whole batch (nothing is queued)."""
        tenant = tenant_of(ctx)
        name, job_config = served(producer, config)
        batch_id = await blocking(submit, tenant, lines, job_config)
        progress = await blocking(producer.store.progress_of, batch_id)
        return {**progress.as_dict(), "config": name}

    @server.tool()
    async def batch_status(ctx: Context, batch_id: str) -> dict[str, Any]:
        """A batch's state and counts (queued, running, succeeded, failed, cancelled)."""
        tenant = tenant_of(ctx)
        await blocking(producer.owned_batch, batch_id, tenant)
        progress = await blocking(producer.store.progress_of, batch_id)
        return progress.as_dict()

    @server.tool()
    async def batch_results(
        ctx: Context,
        batch_id: str,
        offset: Annotated[int, Field(ge=0, description="finished results to skip")] = 0,
        limit: Annotated[int, Field(ge=1, le=MAX_RESULTS_PAGE)] = 20,
    ) -> dict[str, Any]:
        """Finished results in submission order (partial while the batch runs): each job's answers with
        their citation status and citations. Page with `offset`; `next_offset` is null at the end."""
        tenant = tenant_of(ctx)
        await blocking(producer.owned_batch, batch_id, tenant)

        def page() -> tuple[str, list[JobResult], bool]:
            raws = list(itertools.islice(producer.store.iter_results_raw(batch_id), offset, offset + limit + 1))
            state = producer.store.progress_of(batch_id).state
            return state, [JobResult.model_validate_json(r) for r in raws[:limit]], len(raws) > limit

        state, results, more = await blocking(page)
        return {"batch_id": batch_id, "state": state, "results": [result_view(r) for r in results],
                "next_offset": offset + limit if more else None}

    return server


def constant_tenant(tenant: str) -> TenantOf:
    """stdio serves one local user: every call acts as the CLI's tenant."""
    return lambda _ctx: tenant
