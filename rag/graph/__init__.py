"""Knowledge-graph retrieval: a graph of the corpus built at ingest from document titles and their mentions (no
language model), kept in a Cypher store (embedded FalkorDB by default, or Neo4j), searched around the entities a
query names. Modules: ``aliases`` (names and the Aho-Corasick gazetteer), ``build`` (entities, mentions,
co-occurrence), ``cypher`` (every statement), ``store``/``falkordb``/``neo4j`` (the stores), ``linker`` (stage
``link_entities``), ``retriever`` (stage ``retrieve_graph``), ``ingest`` (the generation's graph part), ``serving``
(what a pipeline loads).
"""
