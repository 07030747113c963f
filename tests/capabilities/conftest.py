"""Shared fixtures for the capability tests: a fresh fake corpus and harness deps per test."""

from __future__ import annotations

import pytest

from tests.harness import Deps, FakeCorpus


@pytest.fixture
def corpus() -> FakeCorpus:
    return FakeCorpus()


@pytest.fixture
def deps() -> Deps:
    return Deps()
