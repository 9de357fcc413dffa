"""The semantic answer cache (stage ``cache_lookup``): answers already given, served again to a query whose embedding
is within a cosine threshold of a stored one, with the same top_k, retrievers, rerank flag and index generation.

``semantic.SemanticCache`` implements ``rag.protocols.AnswerCache``. One lives in each generation's ``RagPipeline``
(built by ``warm_up()`` when ``cache.enabled``), so a hot swap starts with an empty one and no answer crosses
generations; the key's generation is checked as well.
"""

from rag.cache.semantic import SemanticCache

__all__ = ["SemanticCache"]
