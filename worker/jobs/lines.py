"""Lines into jobs: the one function that validates a batch, for every producer.

`parse_batch` is the boundary: the API and the CLI both call it, every line is checked before
anything is stored, and a rejected batch is reported line by line with nothing enqueued.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from capabilities import has_machine_tag

from .models import JobConfig, JobSpec

CONFIG_LINE = 0  # JobLineError.line_no for problems with the batch's config rather than a line
MAX_TEXT = 32_000


class JobLineError(ValueError):
    """A line that cannot become a job. The whole batch is refused, so nothing is half-enqueued."""

    def __init__(self, line_no: int, problem: str) -> None:
        where = "config" if line_no == CONFIG_LINE else f"line {line_no}"
        super().__init__(f"{where}: {problem}")
        self.line_no, self.problem = line_no, problem

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line_no, "problem": self.problem}


@dataclass
class BatchReport:
    """The outcome of validating a whole batch: jobs to store, or errors and nothing to store."""

    config: JobConfig | None
    jobs: list[JobSpec] = field(default_factory=list)
    errors: list[JobLineError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.config is not None and bool(self.jobs)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} is longer than {MAX_TEXT} characters")
    if has_machine_tag(value):
        raise ValueError(f"{what} contains a machine tag ([cite-request ...] or [evidence-image ...]); only the "
                         "worker writes those, so a producer's text may not carry one")
    return value


def _message_text(n: int, message: Any) -> str:
    """OpenAI-batch messages: user turns only. Instructions and tools come from the job config, and
    a question job carries no history (H1), so anything else is refused rather than ignored."""
    if not isinstance(message, dict):
        raise ValueError(f"body.messages[{n}] must be an object")
    role = message.get("role")
    if role == "tool" or message.get("tool_calls") or message.get("function_call"):
        raise ValueError(f"body.messages[{n}]: tool calls and tool results are not accepted; the worker's "
                         "capabilities are the only tools")
    if role in ("system", "developer"):
        raise ValueError(f"body.messages[{n}]: {role} messages are not accepted; instructions come from the "
                         "job config (agent.instructions)")
    if role == "assistant":
        raise ValueError(f"body.messages[{n}]: assistant messages would be history, and a job carries none "
                         "(H1); send only the user turns")
    if role != "user":
        raise ValueError(f"body.messages[{n}].role must be 'user', got {role!r}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"body.messages[{n}]: only text content is accepted, got {kind!r}")
            texts.append(part.get("text", ""))
        content = "\n".join(texts)
    return _text(content, f"body.messages[{n}].content")


_OPENAI_LINE_KEYS = {"custom_id", "method", "url", "body", "metadata"}
_PLAIN_LINE_KEYS = {"custom_id", "question", "turns", "metadata"}


def parse_line(line_no: int, data: Any) -> JobSpec:
    """One line in any accepted shape; raises JobLineError naming the line and the problem."""
    try:
        if not isinstance(data, dict):
            raise ValueError(f"a line is a JSON object, got {type(data).__name__}")
        custom_id = data.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id.strip() or len(custom_id) > 256:
            raise ValueError("custom_id is required: a non-empty string of at most 256 characters")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("metadata must be an object")
        if "history" in data or "message_history" in data:
            raise ValueError("a question job carries no history (H1): send the turns as a conversation")
        if "body" in data:
            unknown = sorted(set(data) - _OPENAI_LINE_KEYS)
            if unknown:
                raise ValueError(f"unknown keys {unknown} in an OpenAI-batch line")
            if data.get("method", "POST") != "POST":
                raise ValueError(f"method must be POST, got {data.get('method')!r}")
            body = data["body"]
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
                raise ValueError("body.messages must be a non-empty list")
            extra = sorted(set(body) - {"messages", "model"})
            if extra:
                raise ValueError(f"body keys {extra} are not accepted: sampling and tools come from the job config")
            texts = [_message_text(n, m) for n, m in enumerate(body["messages"])]
            if "model" in body:
                metadata = {**metadata, "requested_model": body["model"]}
            if len(texts) == 1:
                return JobSpec(line_no=line_no, custom_id=custom_id, kind="question", question=texts[0],
                               metadata=metadata)
            return JobSpec(line_no=line_no, custom_id=custom_id, kind="conversation", turns=texts,
                           metadata=metadata)
        unknown = sorted(set(data) - _PLAIN_LINE_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; a line has custom_id, question or turns, and metadata")
        if ("question" in data) == ("turns" in data):
            raise ValueError("a line has exactly one of `question` (one question) or `turns` (a conversation)")
        if "question" in data:
            return JobSpec(line_no=line_no, custom_id=custom_id, kind="question",
                           question=_text(data["question"], "question"), metadata=metadata)
        turns = data["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError("turns must be a non-empty list of strings")
        if not all(isinstance(t, str) for t in turns):
            raise ValueError("turns are the user's questions, as strings; answers, tool calls and evidence "
                             "state are never accepted as history (the worker keeps a conversation's history)")
        return JobSpec(line_no=line_no, custom_id=custom_id, kind="conversation",
                       turns=[_text(t, f"turns[{i}]") for i, t in enumerate(turns)], metadata=metadata)
    except ValidationError as exc:
        raise JobLineError(line_no, _first_error(exc)) from None
    except ValueError as exc:
        raise JobLineError(line_no, str(exc)) from None


def _decode(raw: str | bytes | Mapping[str, Any]) -> Any:
    if isinstance(raw, (str, bytes)):
        return json.loads(raw)
    return raw


def parse_batch(
    lines: Iterable[str | bytes | Mapping[str, Any]],
    config: JobConfig | Mapping[str, Any] | str,
    *,
    corpora: Collection[str] | None = None,
    max_lines: int = 100_000,
) -> BatchReport:
    """Validate a config and every line. `corpora` (names the submitter knows are served) adds the
    unknown-corpus check at submission; workers check again, since they are the ones that open files."""
    report = BatchReport(config=None)
    try:
        if isinstance(config, JobConfig):
            report.config = config
        elif isinstance(config, str):
            report.config = JobConfig.from_text(config)
        else:
            report.config = JobConfig.model_validate(config)
    except ValidationError as exc:
        report.errors.append(JobLineError(CONFIG_LINE, _first_error(exc)))
    except ValueError as exc:
        report.errors.append(JobLineError(CONFIG_LINE, str(exc)))
    if report.config is not None and corpora is not None:
        missing = sorted(report.config.composition.corpora - set(corpora))
        for name in missing:
            known = ", ".join(sorted(corpora)) or "none"
            report.errors.append(JobLineError(CONFIG_LINE, f"corpus {name!r} is not served here; known: {known}"))

    seen: dict[str, int] = {}
    count = 0
    for line_no, raw in enumerate(lines, start=1):
        if isinstance(raw, (str, bytes)) and not raw.strip():
            continue
        count += 1
        if count > max_lines:
            report.errors.append(JobLineError(line_no, f"a batch holds at most {max_lines} jobs"))
            break
        try:
            try:
                data = _decode(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise JobLineError(line_no, f"not valid JSON: {exc}") from None
            spec = parse_line(line_no, data)
            if spec.custom_id in seen:
                raise JobLineError(line_no, f"custom_id {spec.custom_id!r} repeats line {seen[spec.custom_id]}")
            seen[spec.custom_id] = line_no
            report.jobs.append(spec)
        except JobLineError as exc:
            report.errors.append(exc)
    if count == 0:
        report.errors.append(JobLineError(CONFIG_LINE, "the batch has no jobs"))
    return report
