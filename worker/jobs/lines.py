"""Lines into jobs: the one function that validates a batch, for every producer.

`parse_batch` is the boundary: the API and the CLI both call it, every line is checked before
anything is stored, and a rejected batch is reported line by line with nothing enqueued. A line is
one of two pydantic models, `PlainLine` (question or turns) or `BatchLine` (OpenAI batch, with
body.messages); both forbid keys they do not declare, and their validators say what was refused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from capabilities import has_machine_tag

from .models import JobConfig, JobSpec
from .problems import problem, refused

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


def _user_text(value: Any) -> str:
    """What a producer may send as a question: text of bounded length, with no machine tag in it."""
    if not isinstance(value, str) or not value.strip():
        raise refused("{at} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise refused(f"{{at}} is longer than {MAX_TEXT} characters")
    if has_machine_tag(value):
        raise refused("{at} contains a machine tag ([cite-request ...] or [evidence-image ...]); only the "
                      "worker writes those, so a producer's text may not carry one")
    return value


def _custom_id(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise refused("custom_id is required: a non-empty string of at most 256 characters")
    return value


def _an_object(value: Any) -> Any:
    if not isinstance(value, dict):
        raise refused("{at} must be an object")
    return value


def _turn_list(value: Any) -> Any:
    if not isinstance(value, list) or not value:
        raise refused("turns must be a non-empty list of strings")
    if not all(isinstance(t, str) for t in value):
        raise refused("turns are the user's questions, as strings; answers, tool calls and evidence state are "
                      "never accepted as history (the worker keeps a conversation's history)")
    return value


UserText = Annotated[str, BeforeValidator(_user_text)]
HISTORY_KEYS = ("history", "message_history")  # H1: refused with the reason, not as unknown keys


class _Line(BaseModel):
    """What every line carries. Unknown keys are refused, never ignored: a misspelt `question`
    must not become a job that asks nothing."""

    model_config = ConfigDict(extra="forbid")
    UNKNOWN_KEYS: ClassVar[str]  # the message for keys the line does not have; {keys} lists them

    custom_id: Annotated[str, BeforeValidator(_custom_id)] = Field(default=None, validate_default=True)
    metadata: Annotated[dict[str, Any], BeforeValidator(_an_object)] = {}

    def spec(self, line_no: int) -> JobSpec:
        raise NotImplementedError


class PlainLine(_Line):
    """`{"custom_id", "question" | "turns", "metadata"}`: one question, or a conversation's user turns."""

    UNKNOWN_KEYS = ("unknown keys {keys}; a line has custom_id, question or turns, and metadata, or, in the "
                    "OpenAI-batch form, custom_id, body (with messages), method, url and metadata")

    question: Annotated[str | None, BeforeValidator(_user_text)] = None
    turns: Annotated[list[UserText] | None, BeforeValidator(_turn_list)] = None

    @model_validator(mode="after")
    def _one_kind(self) -> PlainLine:
        if ("question" in self.model_fields_set) == ("turns" in self.model_fields_set):
            raise refused("a line has exactly one of `question` (one question) or `turns` (a conversation)")
        return self

    def spec(self, line_no: int) -> JobSpec:
        if self.question is not None:
            return JobSpec(line_no=line_no, custom_id=self.custom_id, kind="question", question=self.question,
                           metadata=self.metadata)
        return JobSpec(line_no=line_no, custom_id=self.custom_id, kind="conversation", turns=self.turns or [],
                       metadata=self.metadata)


class ChatMessage(BaseModel):
    """OpenAI-batch messages: user turns only. Instructions and tools come from the job config, and
    a question job carries no history (H1), so anything else is refused rather than ignored."""

    role: Literal["user"]
    content: UserText = Field(default=None, validate_default=True)  # a missing content is an empty question

    @model_validator(mode="before")
    @classmethod
    def _user_turn(cls, message: Any) -> Any:
        message = _an_object(message)
        role = message.get("role")
        if role == "tool" or message.get("tool_calls") or message.get("function_call"):
            raise refused("{at}: tool calls and tool results are not accepted; the worker's capabilities are "
                          "the only tools")
        if role in ("system", "developer"):
            raise refused(f"{{at}}: {role} messages are not accepted; instructions come from the job config "
                          "(agent.instructions)")
        if role == "assistant":
            raise refused("{at}: assistant messages would be history, and a job carries none (H1); send only "
                          "the user turns")
        if role != "user":
            raise refused(f"{{at}}.role must be 'user', got {role!r}")
        content = message.get("content")
        if isinstance(content, list):
            return {**message, "content": "\n".join(_text_part(part) for part in content)}
        return message


def _text_part(part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text":
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise refused(f"{{at}}: only text content is accepted, got {kind!r}")
    text = part.get("text", "")
    if not isinstance(text, str):
        raise refused(f"{{at}}: a text part's text is a string, got {type(text).__name__}")
    return text


def _listed_messages(body: Any) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise refused("body.messages must be a non-empty list")
    return body


class ChatBody(BaseModel):
    """A chat-completions request body, as far as a job takes it: the messages, and the model asked
    for (kept in metadata; the job config chooses the model)."""

    model_config = ConfigDict(extra="forbid")
    UNKNOWN_KEYS: ClassVar[str] = "body keys {keys} are not accepted: sampling and tools come from the job config"

    messages: list[ChatMessage]
    model: Any = None


class BatchLine(_Line):
    """An OpenAI batch-API line: `{"custom_id", "method", "url", "body": {"messages", "model"}, "metadata"}`."""

    UNKNOWN_KEYS = "unknown keys {keys} in an OpenAI-batch line"

    method: Any = "POST"
    url: Any = None
    body: Annotated[ChatBody, BeforeValidator(_listed_messages)]

    @field_validator("method")
    @classmethod
    def _post(cls, method: Any) -> Any:
        if method != "POST":
            raise refused(f"method must be POST, got {method!r}")
        return method

    def spec(self, line_no: int) -> JobSpec:
        texts = [m.content for m in self.body.messages]
        metadata = self.metadata
        if "model" in self.body.model_fields_set:
            metadata = {**metadata, "requested_model": self.body.model}
        if len(texts) == 1:
            return JobSpec(line_no=line_no, custom_id=self.custom_id, kind="question", question=texts[0],
                           metadata=metadata)
        return JobSpec(line_no=line_no, custom_id=self.custom_id, kind="conversation", turns=texts,
                       metadata=metadata)


def parse_line(line_no: int, data: Any) -> JobSpec:
    """One line in any accepted shape; raises JobLineError naming the line and the problem."""
    if not isinstance(data, dict):
        raise JobLineError(line_no, f"a line is a JSON object, got {type(data).__name__}")
    line: type[_Line] = BatchLine if "body" in data else PlainLine
    try:
        return line.model_validate(data).spec(line_no)
    except ValidationError as exc:
        raise JobLineError(line_no, _line_problem(exc, line)) from None


def _line_problem(exc: ValidationError, line: type[_Line]) -> str:
    """The first problem, in the order a producer would fix them: the line's identity (custom_id,
    metadata), then keys it should not have, then its contents. Unknown keys are named together."""
    def order(error: ErrorDetails) -> tuple[bool, bool, int]:
        extra = error["type"] == "extra_forbidden"
        return error["loc"][:1] not in (("custom_id",), ("metadata",)), not extra, len(error["loc"]) if extra else 0

    errors = sorted(exc.errors(), key=order)
    first = errors[0]
    if first["type"] != "extra_forbidden":
        return problem(first)
    parent = first["loc"][:-1]
    keys = sorted(str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == parent)
    if not parent and any(key in HISTORY_KEYS for key in keys):
        return "a question job carries no history (H1): send the turns as a conversation"
    owner = ChatBody if parent == ("body",) else line
    return owner.UNKNOWN_KEYS.format(keys=keys)


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
        report.errors.append(JobLineError(CONFIG_LINE, problem(exc.errors()[0])))
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
