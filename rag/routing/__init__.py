"""The query router (stage ``route``): per query, which retrievers run and with what fusion weights, chosen among a
closed set of routes (``arms``) by a small multinomial logistic regression (``model``, numpy only) over cheap
lexical features of the query and its linked entities (``features``). The model ships with the code
(``router.npz``); ``ragheat train-router`` retrains it from per-query outcomes on BEIR training splits (``train``).
``names`` parses retriever names (``hybrid+graph``, ``routed``) for requests, settings and eval.
"""
