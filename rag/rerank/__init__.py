"""The late-interaction reranker (stage ``rerank``): ColBERT-style MaxSim over the fused candidates.

Token vectors come from the MiniLM encoder already in the query path (its ONNX graph returns the pooled embedding
and every token's last hidden state from one run), projected to 128 dimensions by a small trained head (``head``: a
matrix exported to ONNX and run on ONNX Runtime, ``onnx_head``, plus a learned combination with the first-stage
scores; no torch when serving). Each document's token vectors are computed once at ingest and stored in the index
generation (``store``); a query's come from the embed stage's own run, so reranking adds no second transformer run;
MaxSim over int8 vectors runs on ONNX Runtime's integer product (``maxsim.Int8MaxSim``). ``train`` (torch) fits a
head on a BEIR split with hard negatives mined from ragheat's own hybrid retriever.
"""
