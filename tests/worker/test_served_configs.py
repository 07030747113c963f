"""I1: the configs an operator serves by name (GROUNDED_CONFIGS), for callers that cannot send one."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.api.app import create_api
from worker.jobs.served import BrokenConfig, UnknownConfig, config_name, read_config
from worker.producer import Producer
from worker.settings import Settings

SERVED = {"qa": Path("/srv/qa.yaml"), "chat": Path("/srv/chat.yaml")}


def test_the_setting_reads_name_path_pairs_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUNDED_CONFIGS", "qa=/srv/qa.yaml, chat=/srv/chat.yaml")
    monkeypatch.setenv("GROUNDED_DEFAULT_CONFIG", "qa")
    settings = Settings()
    assert settings.configs == SERVED and settings.default_config == "qa"
    monkeypatch.setenv("GROUNDED_CONFIGS", '{"qa": "/srv/qa.yaml"}')
    assert Settings().configs == {"qa": Path("/srv/qa.yaml")}


def test_I1_a_request_means_its_name_else_the_default_else_the_only_config() -> None:
    assert config_name(SERVED, "chat", "qa") == "chat"
    assert config_name(SERVED, None, "qa") == "qa"
    assert config_name({"qa": SERVED["qa"]}, None, None) == "qa"
    with pytest.raises(UnknownConfig, match="no config was named and this server has no default"):
        config_name(SERVED, None, None)
    with pytest.raises(UnknownConfig, match="config 'gpt-4o' is not served here; served configs: chat, qa"):
        config_name(SERVED, "gpt-4o", "qa")


def test_the_api_refuses_to_start_with_a_config_it_cannot_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("agent: {model: extractive, capabilities: [NoSuchCapability]}\n")
    cases = [
        ({"configs": {"missing": tmp_path / "missing.yaml"}}, "cannot read"),
        ({"configs": {"broken": broken}}, "'NoSuchCapability' is not allowed here"),
        ({"configs": {}, "default_config": "qa"}, "GROUNDED_DEFAULT_CONFIG 'qa' is not in GROUNDED_CONFIGS"),
    ]
    for extra, problem in cases:
        settings = Settings(api_tokens={"t": "acme"}, **extra)  # type: ignore[arg-type]
        producer = Producer(settings)
        with pytest.raises(RuntimeError, match=problem):
            create_api(settings, producer=producer)
        producer.app.close()


def test_a_broken_served_config_reads_as_every_other_config_problem(tmp_path: Path) -> None:
    """The one formatter of validation errors (jobs.problems): the value's path, pydantic's message
    without its "Value error, " prefix, and our own refusals as they were raised."""
    cases = {
        "run: {retries: many}": "run.retries: Input should be a valid integer, unable to parse string as an integer",
        "agent: {model: extractive, capabilities: [NoSuch]}": "agent: capability 'NoSuch' is not allowed here; allowed:",
    }
    for text, expected in cases.items():
        path = tmp_path / "qa.yaml"
        path.write_text(text if text.startswith("agent") else f"agent: {{model: extractive}}\n{text}\n")
        with pytest.raises(BrokenConfig) as broken:
            read_config("qa", path)
        assert str(broken.value).startswith(f"GROUNDED_CONFIGS 'qa' ({path}): {expected}")
