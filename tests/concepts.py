"""A tiny meaning model for tests: words map to shared concepts, so a paraphrase lands near the
passage it means while sharing none of its words (BM25 cannot find it; vectors can).

Used in-process (`ConceptEmbeddingModel`, a pydantic-ai EmbeddingModel) and by the fake
OpenAI-compatible `/v1/embeddings` server, so both paths embed the same way.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult, EmbeddingSettings
from pydantic_ai.embeddings.result import EmbedInputType

DIMENSIONS = 16
CONCEPTS = {
    "dew": 0, "moisture": 0, "condensation": 0, "damp": 0,
    "heaters": 1, "warming": 1, "coils": 1, "heater": 1,
    "ticket": 2, "fare": 2, "pass": 2,
    "lenses": 3, "optics": 3, "glass": 3,
}
_WORD = re.compile(r"[a-z]+")


def concept_vector(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """Concept words weigh 1 on their concept; other words a little on a hashed spare dimension."""
    vector = [0.0] * dimensions
    spare = dimensions - 1 - max(CONCEPTS.values())
    for word in _WORD.findall(text.lower()):
        if word in CONCEPTS:
            vector[CONCEPTS[word]] += 1.0
        else:
            vector[dimensions - 1 - zlib.crc32(word.encode()) % spare] += 0.05
    if not any(vector):
        vector[-1] = 1.0
    return vector


class ConceptEmbeddingModel(EmbeddingModel):
    """`concept_vector` behind pydantic-ai's embedding interface; counts calls by input type."""

    def __init__(self, dimensions: int = DIMENSIONS) -> None:
        super().__init__()
        self.dimensions = dimensions
        self.calls: list[tuple[EmbedInputType, int]] = []

    @property
    def model_name(self) -> str:
        return "concepts"

    @property
    def system(self) -> str:
        return "test"

    async def embed(
        self, inputs: str | Sequence[str], *, input_type: EmbedInputType, settings: EmbeddingSettings | None = None
    ) -> EmbeddingResult:
        texts, _ = self.prepare_embed(inputs, settings)
        self.calls.append((input_type, len(texts)))
        return EmbeddingResult([concept_vector(t, self.dimensions) for t in texts], inputs=texts,
                               input_type=input_type, model_name="concepts", provider_name="test")
