"""H6 at the model: the job's retry policy is the only retry, so no SDK client retries on its own,
and the setting that stops it is sent only to models whose client would."""

from __future__ import annotations

import pytest

from tests.worker.conftest import PASSAGES, POLICY, question_config
from worker.jobs.models import JobConfig
from worker.runtime.extractive import EXTRACTIVE
from worker.runtime.llms import NO_SDK_RETRIES, build_model, sdk_retry_settings


def test_H6_an_endpoint_model_never_retries_and_needs_no_per_request_setting() -> None:
    config = JobConfig.model_validate(question_config(PASSAGES, POLICY, model="fake-model",
                                                      endpoint={"base_url": "http://127.0.0.1:9/v1"}))
    model = build_model(config)
    assert model.client.max_retries == 0  # type: ignore[attr-defined]
    assert sdk_retry_settings(model) == {}


def test_H6_a_provider_model_whose_client_retries_gets_them_turned_off_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    model = build_model(JobConfig.model_validate(question_config(PASSAGES, POLICY, model="openai:gpt-4o")))
    assert model.client.max_retries != 0  # type: ignore[attr-defined]
    assert sdk_retry_settings(model) == NO_SDK_RETRIES


def test_H6_a_model_without_an_sdk_client_gets_the_setting_it_ignores() -> None:
    model = build_model(JobConfig.model_validate(question_config(PASSAGES, POLICY, model=EXTRACTIVE)))
    assert sdk_retry_settings(model) == NO_SDK_RETRIES
