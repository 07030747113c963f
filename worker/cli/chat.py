"""`grounded chat`: an interactive terminal chat on a stored conversation (worker.interfaces.chat).

Each line is one more turn, answered through the queue by the workers, and shown with its citation
status and citations (document, page). `/new` starts over, `/resume ID` continues a conversation,
`/quit` (or Ctrl-D) leaves. Talks to Redis directly and acts as the CLI's tenant.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from worker.interfaces.chat import ChatSession
    from worker.jobs.models import JobConfig, TurnResult
    from worker.producer import Producer

HELP = ("Ask a question and press Enter. /new starts a new conversation, /resume ID continues one, "
        "/id shows the current one, /quit (or Ctrl-D) leaves.")
PROMPT = "you> "  # plain, so scripts driving the chat (expect, pexpect) can wait for it
STATUS_STYLE = {"grounded": "green", "ungrounded": "yellow", "missing": "red"}


def show_turn(console: Console, turn: TurnResult) -> None:
    from worker.interfaces.grounding import answer_text, citation_view

    console.print(escape(answer_text(turn.answer)), highlight=False)
    status = turn.citation_status
    extra = f", {turn.redirects} redirect{'s' if turn.redirects != 1 else ''}" if turn.redirects else ""
    extra += ", policy violation" if turn.violation else ""
    console.print(f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]{extra}")
    for n, cited in enumerate(turn.cited, start=1):
        view = citation_view(cited)
        pages = view["pages"]
        where = f", page {pages[0]}" if len(pages) == 1 else (f", pages {pages[0]}-{pages[-1]}" if pages else "")
        console.print(f"  [{n}] {escape(str(view['document']))}{where} ({escape(cited.chunk_id)})",
                      highlight=False, soft_wrap=True)  # one line a citation, however narrow the terminal


def _config(producer: Producer, path: Path | None) -> JobConfig:
    from worker.jobs.models import JobConfig

    if path is not None:
        return JobConfig.from_text(path.read_text())
    return producer.served_config(None)[1]


def _command(console: Console, session: ChatSession, line: str) -> bool:
    """Handles a /command; False when the chat should end."""
    from worker.producer import NotFound

    name, _, argument = line.partition(" ")
    if name in ("/quit", "/exit"):
        return False
    if name == "/new":
        session.start_over()
        console.print("new conversation: it starts with your next question")
    elif name == "/resume" and argument.strip():
        try:
            meta, turns = session.resume(argument.strip())
        except NotFound as exc:
            console.print(f"[red]{escape(str(exc))}[/]")
            return True
        console.print(f"resumed conversation {meta.id}: {len(turns)} turn{'s' if len(turns) != 1 else ''} so far")
        if not meta.composition.compactor:
            console.print("[yellow]it was started without the compactor and keeps its composition (H3)[/]")
        if turns:
            console.print(f"last question: {escape(turns[-1].result.question_text)}")
            show_turn(console, turns[-1].result)
    elif name == "/id":
        console.print(f"conversation {session.conversation_id or '(none yet: your next question starts one)'}")
    else:
        console.print(HELP, highlight=False)
    return True


def _ask(console: Console, session: ChatSession, question: str, timeout: float) -> None:
    from worker.jobs.lines import JobLineError
    from worker.store.conversations import CompositionMismatch, ConversationNotFound

    starting = session.conversation_id is None
    try:
        job = session.send(question)
    except JobLineError as exc:
        console.print(f"[red]{escape(exc.problem)}[/]")
        return
    except (ConversationNotFound, CompositionMismatch) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        return
    if starting:
        console.print(f"[dim]conversation {session.conversation_id} (/resume it later)[/]", highlight=False)
    try:
        result = session.wait(job, timeout_s=timeout)
    except KeyboardInterrupt:
        result = None
    if result is None:
        console.print(f"[yellow]still answering; /resume {session.conversation_id} later shows it[/]")
    elif result.status == "failed" or not result.turns:
        console.print(f"[red]failed: {escape(result.error.message if result.error else 'no answer')}[/]")
    else:
        show_turn(console, result.turns[-1])


def register(cli: typer.Typer) -> None:
    @cli.command("chat")
    def chat(
        config: Annotated[Path | None, typer.Option(
            help="job config for new conversations (default: the served default, GROUNDED_CONFIGS)",
            exists=True, dir_okay=False)] = None,
        conversation: Annotated[str | None, typer.Option("--conversation", help="resume this conversation")] = None,
        tenant: Annotated[str | None, typer.Option(help="tenant to chat as (default GROUNDED_CLI_TENANT)")] = None,
        timeout: Annotated[float, typer.Option(help="seconds to wait for each answer")] = 300.0,
    ) -> None:
        """Chat with the knowledge base on a stored conversation; the compactor is registered."""
        from worker.interfaces.chat import ChatSession
        from worker.jobs.served import BrokenConfig, UnknownConfig
        from worker.producer import Producer
        from worker.settings import get_settings

        console = Console()
        settings = get_settings()
        producer = Producer(settings)
        try:
            job_config = _config(producer, config)
        except (UnknownConfig, BrokenConfig, ValueError) as exc:
            console.print(f"[red]{escape(str(exc))}[/]\ngive a job config with --config FILE")
            raise typer.Exit(2) from None
        session = ChatSession(producer, tenant=tenant or settings.cli_tenant, config=job_config)
        console.print(f"grounded chat. {HELP}", highlight=False)
        if conversation is not None:
            from worker.producer import NotFound

            try:
                session.resume(conversation)
            except NotFound as exc:
                console.print(f"[red]{escape(str(exc))}[/]")
                raise typer.Exit(1) from None
            _command(console, session, f"/resume {conversation}")
        while True:
            try:
                line = console.input(PROMPT).strip()
            except (EOFError, KeyboardInterrupt):
                console.print()
                return
            if not line:
                continue
            if line.startswith("/"):
                if not _command(console, session, line):
                    return
                continue
            _ask(console, session, line, timeout)
