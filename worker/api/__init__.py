"""The producer HTTP API. `create_api(settings)` builds the FastAPI app; `grounded api` serves it."""

from .app import create_api

__all__ = ["create_api"]
