"""parse_batch: the one validation both producers call; every problem names its line."""

from __future__ import annotations

import json

import pytest

from worker.jobs.composition import ALLOWED
from worker.jobs.lines import CONFIG_LINE, parse_batch, parse_line
from worker.jobs.models import JobConfig

CONFIG = {"agent": {"model": "extractive", "capabilities": [{"PassageSearchCapability": {"corpus": "handbook"}},
                                                             "CitationPolicyCapability"]}}


def problems(report) -> dict[int, str]:
    return {e.line_no: e.problem for e in report.errors}


def test_every_bad_line_is_reported_with_its_number_and_nothing_is_accepted() -> None:
    lines = [
        json.dumps({"custom_id": "a", "question": "When does it open?"}),
        "{not json",
        json.dumps({"question": "no id"}),
        "",
        json.dumps({"custom_id": "b", "question": "q", "turns": ["t"]}),
        json.dumps({"custom_id": "a", "question": "again"}),
    ]
    report = parse_batch(lines, CONFIG)
    found = problems(report)
    assert not report.ok
    assert sorted(found) == [2, 3, 5, 6]
    assert found[2].startswith("not valid JSON")
    assert "custom_id is required" in found[3]
    assert "exactly one of `question`" in found[5]
    assert found[6] == "custom_id 'a' repeats line 1"


def test_a_valid_batch_keeps_line_numbers_kinds_and_metadata() -> None:
    report = parse_batch(
        [{"custom_id": "a", "question": "q?", "metadata": {"answerable": False}},
         {"custom_id": "b", "turns": ["x", "y"]}],
        CONFIG,
    )
    assert report.ok
    assert [(j.line_no, j.kind, j.prompts()) for j in report.jobs] == [
        (1, "question", ["q?"]), (2, "conversation", ["x", "y"])]
    assert report.jobs[0].metadata == {"answerable": False}


def test_unknown_capability_is_refused_naming_the_allowed_ones() -> None:
    config = {"agent": {"model": "extractive", "capabilities": ["WebFetch"]}}
    report = parse_batch([{"custom_id": "a", "question": "q"}], config)
    [error] = report.errors
    assert error.line_no == CONFIG_LINE
    assert "capability 'WebFetch' is not allowed here" in error.problem
    assert all(name in error.problem for name in ALLOWED)


@pytest.mark.parametrize("corpus", ["../handbook", "/etc/passwd", "a/b", "..", "hand book"])
def test_a_corpus_path_is_refused(corpus: str) -> None:
    config = {"agent": {"model": "extractive", "capabilities": [{"PassageSearchCapability": {"corpus": corpus}}]}}
    [error] = parse_batch([{"custom_id": "a", "question": "q"}], config).errors
    assert error.line_no == CONFIG_LINE
    assert f"corpus {corpus!r} is not a corpus name" in error.problem


def test_an_unknown_corpus_is_refused_at_submission_when_the_corpora_are_known() -> None:
    report = parse_batch([{"custom_id": "a", "question": "q"}], CONFIG, corpora=["atlas", "manual"])
    [error] = report.errors
    assert error.problem == "corpus 'handbook' is not served here; known: atlas, manual"


def test_unknown_capability_options_are_refused() -> None:
    config = {"agent": {"model": "extractive",
                        "capabilities": [{"PassageSearchCapability": {"corpus": "h", "store": "/tmp/x.sqlite"}}]}}
    [error] = parse_batch([{"custom_id": "a", "question": "q"}], config).errors
    assert "PassageSearchCapability: store: Extra inputs are not permitted" in error.problem


def test_policy_takes_no_options_and_types_are_listed_once() -> None:
    twice = {"agent": {"model": "extractive", "capabilities": ["CitationPolicyCapability", "CitationPolicyCapability"]}}
    assert "listed twice" in parse_batch([{"custom_id": "a", "question": "q"}], twice).errors[0].problem
    options = {"agent": {"model": "extractive", "capabilities": [{"CitationPolicyCapability": {"strict": True}}]}}
    assert "takes no options" in parse_batch([{"custom_id": "a", "question": "q"}], options).errors[0].problem


def test_H1_a_question_job_carrying_history_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"carries no history \(H1\)"):
        parse_line(4, {"custom_id": "a", "question": "q", "history": [{"role": "user", "content": "x"}]})


def test_openai_batch_lines_become_questions_or_conversations() -> None:
    one = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "gpt-x", "messages": [{"role": "user", "content": "When?"}]}}
    two = {"custom_id": "b", "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                                   {"role": "user", "content": "And then?"}]}}
    a, b = parse_line(1, one), parse_line(2, two)
    assert (a.kind, a.question, a.metadata) == ("question", "When?", {"requested_model": "gpt-x"})
    assert (b.kind, b.turns) == ("conversation", ["Hi", "And then?"])


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, "tool calls and tool results"),
        ({"role": "tool", "tool_call_id": "c", "content": "x"}, "tool calls and tool results"),
        ({"role": "assistant", "content": "earlier answer"}, "assistant messages would be history"),
        ({"role": "system", "content": "be brief"}, "instructions come from the job config"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}, "only text content"),
    ],
)
def test_openai_batch_lines_refuse_anything_but_user_text(message: dict, expected: str) -> None:
    line = {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "q"}, message]}}
    with pytest.raises(ValueError, match=expected):
        parse_line(3, line)


def test_openai_batch_lines_refuse_sampling_keys() -> None:
    line = {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "q"}], "temperature": 0.2}}
    with pytest.raises(ValueError, match=r"body keys \['temperature'\] are not accepted"):
        parse_line(1, line)


def test_config_refuses_unknown_agent_keys_a_missing_model_and_a_key_in_place_of_a_name() -> None:
    bad = [
        ({"agent": {"model": "extractive", "toolsets": []}}, "agent has unknown keys ['toolsets']"),
        ({"agent": {"capabilities": []}}, "agent.model is required"),
        ({"agent": {"model": "m"}, "endpoint": {"base_url": "http://x/v1", "api_key_env": "sk-123"}},
         "must be an environment variable name, not a key"),
        ({"agent": {"model": "m"}, "endpoint": {"base_url": "ftp://x"}}, "must start with http:// or https://"),
    ]
    for config, expected in bad:
        [error] = parse_batch([{"custom_id": "a", "question": "q"}], config).errors
        assert expected in error.problem, error.problem


def test_config_reads_yaml_and_its_digest_ignores_key_order() -> None:
    text = "agent:\n  model: extractive\n  capabilities:\n    - PassageSearchCapability: handbook\nrun:\n  retries: 1\n"
    config = JobConfig.from_text(text)
    assert config.composition.corpora == {"handbook"}
    assert config.run.retries == 1
    reordered = JobConfig.model_validate({"run": {"retries": 1}, "agent": {
        "capabilities": [{"PassageSearchCapability": "handbook"}], "model": "extractive"}})
    assert reordered.digest() == config.digest()


def test_an_empty_batch_is_refused() -> None:
    report = parse_batch(["", "  "], CONFIG)
    assert problems(report) == {CONFIG_LINE: "the batch has no jobs"}


def test_the_unknown_keys_message_names_both_line_forms() -> None:
    [error] = parse_batch([{"custom_id": "a", "questoin": "q"}], CONFIG).errors
    assert error.problem.startswith("unknown keys ['questoin']; a line has custom_id, question or turns, and metadata")
    assert "OpenAI-batch form" in error.problem and "body (with messages)" in error.problem


def test_a_text_part_whose_text_is_not_a_string_is_one_line_error() -> None:
    line = {"custom_id": "a", "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}}
    [error] = parse_batch([line], CONFIG).errors
    assert error.problem == "body.messages[0]: a text part's text is a string, got int"


def test_lines_configs_and_capability_options_report_validation_errors_alike() -> None:
    """One formatter: the path of the bad value as the producer wrote it, then pydantic's message;
    our own messages say where they are themselves."""
    def config_problem(config: dict) -> str:
        return parse_batch([{"custom_id": "a", "question": "q"}], config).errors[0].problem

    assert config_problem({"agent": {"model": "m"}, "run": {"retries": -1}}) == (
        "run.retries: Input should be greater than or equal to 0")
    assert config_problem({"agent": {"model": "m", "model_settings": 5}}) == (
        "agent: agent.model_settings: Input should be a valid dictionary")
    options = {"agent": {"model": "m", "capabilities": [{"PassageSearchCapability": {"corpus": "h", "max_searches": 99,
                                                                                     "x": 1}}]}}
    assert config_problem(options) == ("agent: PassageSearchCapability: max_searches: Input should be less than or "
                                       "equal to 50; x: Extra inputs are not permitted")
    [line] = parse_batch([{"custom_id": "a", "turns": ["q", ""]}], CONFIG).errors
    assert line.problem == "turns[1] must be a non-empty string"
