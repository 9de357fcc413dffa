#!/usr/bin/env bash
# Re-measure every section of docs/benchmarks.md, in order, with the final parameters, then render the doc.
#
#   bash benchmarks/run_all.sh                 every step (how long: benchmarks/README.md)
#   bash benchmarks/run_all.sh query ann       only those steps (then `render`, if you want the doc updated)
#   bash benchmarks/run_all.sh --list          the steps, in order
#
# Each step writes one results file under $RESULTS (default benchmarks/results/) through loadgen/resultsfile.py,
# which records the command, commit, machine and how quiet the machine was. Run it on a quiet machine, from the
# repository root, after `bash scripts/install.sh` (and scripts/install_vllm.sh for the vLLM steps). The probes
# step needs root (eBPF). Logs go to data/bench/run_all/.
#
# SMOKE=1 runs every step with tiny parameters (seconds each) against BEIR=... (a small BEIR folder) into
# RESULTS=... (a scratch folder): it proves the scripts and the renderer work, it measures nothing worth keeping
# (each results file says "smoke": true, and the doc rendered from them says so in every section).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
RH=${RH:-.venv/bin/ragheat}
BEIR=${BEIR:-datasets/scifact}
INDEX_ROOT=${INDEX_ROOT:-data/index}
RESULTS=${RESULTS:-benchmarks/results}
LOGS=${LOGS:-data/bench/run_all}
MODELS=${MODELS:-data/models}
NAME=$(basename "$BEIR")
INDEX=$INDEX_ROOT/$NAME
SPLIT=${SPLIT:-train}
HOTPOT=${HOTPOT:-datasets/hotpotqa-dev}  # the multi-hop set of the graph step, with its split
HOTPOT_SPLIT=${HOTPOT_SPLIT:-dev}

# Final parameters (the ones the doc's figures come from).
INGEST_RUNS="$BEIR:int8,$BEIR:fp32,wiki:int8"
QUERY_ARGS=(--queries 300 --rounds 3)
QUIET_CASE_ARGS=(--rounds 3 --http-queries 300)  # encoders, quality on SciFact train + HotpotQA dev, http side by side
TELEMETRY_ARGS=(--rounds 12 --round-s 5)
OBSERVE_ARGS=(--rounds 10 --round-s 5)
LOADGEN_ARGS=(--rates 500,1000,2000,2500,3000 --duration 5)
KNEE_ARGS=(--rates 50,100,150,200,250,300 --duration 6 --warmup 2)
EXAMPLES_ARGS=(--rates 10,15,20,25,30,40,50 --duration 5 --warmup 1.5 --rounds 2)  # the 3 examples in turn, over their default corpus
REPLICAS_ARGS=(--rates 50,100,150,200,250,300 --duration 5 --warmup 2 --rounds 3)  # 5 configurations, 3 sweeps
ANN_ARGS=()
PROBES_ARGS=(--rounds 12 --round-s 4)
EXPLAIN_ARGS=(--runs 3 --pictures '' --faults none,cpu_hog,overload,gil_hog,graph_slow,disk_writes,none_llm,llm_slow,llm_stopped)  # 30-s windows, 5-s scrapes
EXPLAIN_COLD_CACHE_ARGS=(--runs 3 --pictures '' --faults cold_cache)  # the service in a memory cgroup of its own (root)
EXPLAIN_EXAMPLE_ARGS=(--runs 1 --faults gil_hog)  # its picture goes to docs/images/explain/
FUSION_ARGS=()
GRAPH_ARGS=(--rounds 3 --http-queries 200)
RERANK_LATENCY_ARGS=(--queries 200 --rounds 3 --http-queries 200)
HYDE_ARGS=(--queries 40 --seed 16)          # SciFact train + HotpotQA dev
JUDGE_ARGS=(--limit 20 --seed 16)           # 20 queries x top 10 per set
ANSWERS_ARGS=(--questions 30 --seed 16 --rates 1,4)  # HotpotQA dev answers, then TTFT at 1 and 4 req/s
BOARDS_LLM_ARGS=(--rates 0.25,0.5,1 --duration 60 --warmup 5 --timeout 60)  # the real model's pace
BOARDS_LLM_OUT=docs/images/dashboards
TUNE_REAL_ARGS=(--max-num-seqs 1,4 --max-model-len 1024,2048 --block-size 32 --rate 0.5 --duration 20
                --prompt-tokens 300 --max-tokens 96 --slo-ttft-ms 2000 --slo-e2e-ms 6000)
CACHE_ARGS=(--rates 40,60,80,100,120,140,160,200,240 --duration 6 --warmup 2 --zipf 1.1)
CAPACITY_ARGS=(--rates 50:400:50 --duration 10 --warmup 2 --burst 3 --rounds 3)
STEERING_ARGS=(--rates 60:200:20 --knee-duration 10 --duration 10 --warmup 8)  # knee on shed, 4 steady multiples x 3, the burst x 3, the ramp
TUNING_ARGS=(--queries 300 --unlabelled-queries 50 --judge-sample 20)  # ragheat tune: SciFact with and without labels, HotpotQA
BATCHING_ARGS=()  # bench_batching.py's defaults: off and windows 0/2 ms x 1/2 run slots, side by side
EMBEDDING_ARGS=()  # bench_embedding.py's defaults: 4 schemes, 3 rounds, 300 chunks, no nDCG (the eval steps have it)
TTFT_ARGS=(--queries 40)
GROWTH_ARGS=(--sizes real,30000,100000)  # the ingest step's index and two corpora grown from it
TUNE_ARGS=(--max-num-seqs 1,4,8 --max-model-len 256,512 --block-size 32 --rate 30 --duration 10
           --prompt-tokens 160 --max-tokens 48 --slo-ttft-ms 500 --slo-e2e-ms 2000)
if [ "${SMOKE:-0}" = 1 ]; then
  export RAGHEAT_BENCH_SMOKE=1  # every results file says it holds smoke figures (loadgen/resultsfile.py)
  INGEST_RUNS="$BEIR:int8,$BEIR:fp32"
  QUERY_ARGS=(--queries 20 --rounds 2)
  QUIET_CASE_ARGS=(--parts encoders,http --index "$INDEX")  # the quality part needs both sets' indexes
  GROWTH_ARGS=(--sizes real,2000)
  TELEMETRY_ARGS=(--queries 20 --rounds 2 --round-s 1 --clients 2)
  OBSERVE_ARGS=(--queries 20 --rounds 2 --round-s 1 --clients 2)
  LOADGEN_ARGS=(--rates 100,200 --duration 1 --warmup 0.5)
  KNEE_ARGS=(--rates 5,10 --duration 1 --warmup 0.5)
  EXAMPLES_ARGS=(--docs 50 --rates 2,4 --duration 1 --warmup 0.5 --rounds 1)
  REPLICAS_ARGS=(--rates 5,10 --duration 1 --warmup 0.5)
  ANN_ARGS=(--no-wiki --threads 1,2 --seconds 0.1)
  PROBES_ARGS=(--rounds 2 --round-s 1 --syscall-calls 100000 --round-trips 20000 --syscall-runs 2)
  EXPLAIN_ARGS=(--runs 1 --faults none,cpu_hog --window-s 10 --scrape-s 1 --fault-s 10 --pictures '')
  EXPLAIN_EXAMPLE_ARGS=(--runs 1 --faults cpu_hog --window-s 10 --scrape-s 1 --fault-s 10 --pictures "$LOGS/pictures")
  FUSION_ARGS=(--k 1,5,60 --bm25-weight 1.0,1.2)
  # the graph step measures the SciFact subset unless HOTPOT names a small multi-hop folder
  if [ "$HOTPOT" = datasets/hotpotqa-dev ]; then HOTPOT=$BEIR HOTPOT_SPLIT=$SPLIT; fi
  GRAPH_ARGS=(--rounds 1 --http-queries 10)
  EMBEDDING_ARGS=(--schemes fp32,int8 --rounds 1 --chunks 20 --probes 5 --mixes 2 --agree 10
                  --queries-per-round 10 --ndcg '')
  TTFT_ARGS=(--queries 3 --max-tokens 8)
  RERANK_LATENCY_ARGS=(--queries 5 --rounds 1 --http-queries 5)
  HYDE_ARGS=(--set "$NAME=$BEIR:$SPLIT:$INDEX")
  JUDGE_ARGS=(--set "$NAME=$BEIR:$SPLIT:$INDEX")
  ANSWERS_ARGS=()  # needs a folder with questions_full.jsonl (HotpotQA): the defaults, 3 questions
  TUNE_REAL_ARGS=(--max-num-seqs 1 --max-model-len 512 --block-size 32 --rate 1 --duration 2 --prompt-tokens 32
                  --max-tokens 8 --slo-ttft-ms 2000 --slo-e2e-ms 6000)
  CACHE_ARGS=(--rates 5,10 --duration 1 --warmup 0.5 --pause 0.2 --lookups 200 --lookup-sizes 256,1024)
  BOARDS_LLM_ARGS=(--rates 1 --duration 2 --warmup 0 --timeout 60)
  BOARDS_LLM_OUT=$LOGS/boards-llm
  CAPACITY_ARGS=(--rates 5,10 --duration 1 --warmup 0.5 --burst 1 --rounds 1)
  TUNING_ARGS=(--queries 20 --unlabelled-queries 5 --judge-sample 0 --rounds 3 --rates 5,10 --duration 1)
  STEERING_ARGS=(--rates 5,10 --knee-duration 1 --knee-warmup 0.5 --duration 1 --warmup 1 --burst-base 1 --burst 2
                 --burst-after 2 --ramp 2 --settle-timeout 5 --drain-timeout 20)
  BATCHING_ARGS=(--rates 5,10 --duration 1 --warmup 0.5 --c1-duration 1 --c1-rounds 1 --windows off,0 --runs 2)
  TUNE_ARGS=(--max-num-seqs 1,4 --max-model-len 256 --block-size 32 --rate 5 --duration 2
             --prompt-tokens 32 --max-tokens 8 --slo-ttft-ms 500 --slo-e2e-ms 2000)
fi

step_ingest() { "$PY" benchmarks/bench_ingest.py --runs "$INGEST_RUNS" --index-root "$INDEX_ROOT" \
                  --log "$LOGS/ingest-children.log" --json "$RESULTS/ingest.json"; }
step_eval() { "$RH" eval --beir "$BEIR" --index "$INDEX" --split "$SPLIT" --retrievers dense,bm25,hybrid \
                --results-file "$RESULTS/eval-scifact.json"; }
step_eval-fp32() { RAGHEAT_EMBEDDING__PRECISION=fp32 "$RH" eval --beir "$BEIR" --index "$INDEX-fp32" --split "$SPLIT" \
                     --retrievers dense,bm25,hybrid --results-file "$RESULTS/eval-scifact-fp32.json"; }
step_fusion() { "$PY" benchmarks/tune_fusion.py --beir "$BEIR" --index "$INDEX" --split "$SPLIT" "${FUSION_ARGS[@]}" \
                  --json "$RESULTS/fusion.json"; }
step_query() { "$PY" benchmarks/bench_query.py --beir "$BEIR" --index "$INDEX" "${QUERY_ARGS[@]}" \
                 --json "$RESULTS/query.json"; }
step_quality-drill() { "$PY" benchmarks/bench_quality_drill.py --results-file "$RESULTS/quality-drill.json"; }
step_quality-signals() { "$PY" benchmarks/bench_quality_signals.py --results-file "$RESULTS/quality-signals.json"; }
step_quiet-case() { "$PY" benchmarks/bench_quiet_case.py "${QUIET_CASE_ARGS[@]}" --results-file "$RESULTS/quiet-case.json"; }
step_telemetry() { "$PY" benchmarks/bench_telemetry.py --beir "$BEIR" --index "$INDEX" "${TELEMETRY_ARGS[@]}" \
                     --json "$RESULTS/telemetry.json"; }
step_telemetry-recording() { "$PY" benchmarks/bench_telemetry.py --beir "$BEIR" --index "$INDEX" --recording-only \
                               --json "$RESULTS/telemetry-recording.json"; }
step_observe() { "$PY" benchmarks/bench_observe.py --beir "$BEIR" "${OBSERVE_ARGS[@]}" --json "$RESULTS/observe.json"; }
step_explain() {  # the multi-hop set, whose queries reach the graph store; starts the service, its Prometheus,
  # the model server and the faults itself
  local index=$INDEX_ROOT/$(basename "$HOTPOT")
  "$RH" ingest "$HOTPOT" --index "$index"  # with the graph (the default); a no-op when up to date
  "$PY" benchmarks/bench_explain.py --index "$index" --queries "$HOTPOT/queries.jsonl" "${EXPLAIN_ARGS[@]}" \
    --json "$RESULTS/explain.json"
}
step_explain-cold-cache() {  # a cold page cache under a tight memory limit
  local index=$INDEX_ROOT/$(basename "$HOTPOT")
  "$RH" ingest "$HOTPOT" --index "$index"
  "$PY" benchmarks/bench_explain.py --index "$index" --queries "$HOTPOT/queries.jsonl" "${EXPLAIN_COLD_CACHE_ARGS[@]}" \
    --json "$RESULTS/explain-cold-cache.json"
}
step_explain-example() {  # one fault's drill as an engineer paged would see it: the board's picture, the explanation
  local index=$INDEX_ROOT/$(basename "$HOTPOT")
  "$RH" ingest "$HOTPOT" --index "$index"
  "$PY" benchmarks/bench_explain.py --index "$index" --queries "$HOTPOT/queries.jsonl" "${EXPLAIN_EXAMPLE_ARGS[@]}" \
    --json "$RESULTS/explain-example.json"
}
step_loadgen() { "$PY" benchmarks/bench_loadgen.py "${LOADGEN_ARGS[@]}" --json "$RESULTS/loadgen.json"; }
step_knee() {
  local port log pid
  port=$("$PY" -c 'from rag.childproc import free_port; print(free_port())')
  log="$LOGS/knee-serve.log"
  "$RH" serve --index "$INDEX" --port "$port" >"$log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064
  trap "kill $pid 2>/dev/null || true" EXIT  # each step runs in its own subshell
  for _ in $(seq 600); do
    if [ ! -d "/proc/$pid" ] || grep -q ') Z' "/proc/$pid/stat"; then echo "ragheat serve stopped; see $log" >&2; return 1; fi
    "$PY" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1], timeout=1).status_code != 200)' \
      "http://127.0.0.1:$port/readyz" 2>/dev/null && break
    sleep 0.5
  done
  "$RH" bench --url "http://127.0.0.1:$port" "${KNEE_ARGS[@]}" --queries "$BEIR/queries.jsonl" \
    --server-pid "$pid" --out "$LOGS/knee" --results-file "$RESULTS/knee-scifact.json"
}
step_examples() { "$PY" benchmarks/bench_examples.py "${EXAMPLES_ARGS[@]}" --queries "$BEIR/queries.jsonl" \
                    --work "$LOGS/examples" --json "$RESULTS/examples.json"; }  # starts each example itself
step_ann() { "$RH" ann-bench --beir "$BEIR" --index "$INDEX" "${ANN_ARGS[@]}" --out "$LOGS/ann" \
               --results-file "$RESULTS/ann.json"; }
step_probes() {
  [ "$(id -u)" = 0 ] || { echo "the probes step needs root (eBPF): sudo bash benchmarks/run_all.sh probes" >&2; return 1; }
  "$PY" benchmarks/bench_probes.py --index "$INDEX" --beir "$BEIR" "${PROBES_ARGS[@]}" --json "$RESULTS/probes.json"
}
step_tune-vllm() {
  "$PY" benchmarks/build_tiny_llama.py "$MODELS/tiny-llama"
  "$RH" tune-vllm --model "$MODELS/tiny-llama" --load-format dummy "${TUNE_ARGS[@]}" --out "$LOGS/tune-vllm" \
    --results-file "$RESULTS/tune-vllm.json"
}
step_embedding() { "$PY" benchmarks/bench_embedding.py --beir "$BEIR" --split "$SPLIT" --work "$LOGS/embedding-schemes" \
                     "${EMBEDDING_ARGS[@]}" --json "$RESULTS/embedding.json"; }
step_graph() {
  local index=$INDEX_ROOT/$(basename "$HOTPOT")
  "$RH" ingest "$HOTPOT" --index "$index" --force  # with the graph (the default), at this commit
  "$PY" benchmarks/bench_graph.py --beir "$HOTPOT" --split "$HOTPOT_SPLIT" --index "$index" "${GRAPH_ARGS[@]}" \
    --json "$RESULTS/graph.json"
}
step_routing() {  # the default (routed: retrievers and reranker per question) against every fixed configuration,
  # on the eval and graph steps' indexes, with the shipped router (its training command is in the results)
  "$PY" benchmarks/bench_routing.py --set "$NAME=$BEIR:$SPLIT:$INDEX" \
    --set "$(basename "$HOTPOT")=$HOTPOT:$HOTPOT_SPLIT:$INDEX_ROOT/$(basename "$HOTPOT")" \
    --results-file "$RESULTS/routing.json"
}
step_rerank() {  # quality, held out: SciFact 5-fold CV; each set scored with a head trained on the other
  local sci=$INDEX_ROOT/$NAME-tokens hot=$INDEX_ROOT/$(basename "$HOTPOT")-tokens
  local sci_hot=$INDEX_ROOT/$NAME-tokens-$(basename "$HOTPOT")-head hot_head=$LOGS/rerank-head-$(basename "$HOTPOT").npz
  export RAGHEAT_RERANK__STORE_TOKENS=true
  "$RH" ingest "$BEIR" --index "$sci" --force        # the shipped head's vectors (also the rerank-latency step's index)
  "$RH" ingest "$HOTPOT" --index "$hot" --force
  "$RH" train-reranker --beir "$BEIR" --split "$SPLIT" --index "$sci" --token-cache "$LOGS/rerank-tokens-$NAME" \
    --epochs 4 --seed 0 --cv 5 --out "$LOGS/rerank-head-$NAME.npz" --json "$LOGS/rerank-train-$NAME.json"
  "$RH" train-reranker --beir "$HOTPOT" --split "$HOTPOT_SPLIT" --index "$hot" \
    --token-cache "$LOGS/rerank-tokens-$(basename "$HOTPOT")" --epochs 4 --seed 0 --out "$hot_head"
  RAGHEAT_RERANK__HEAD="$hot_head" "$RH" ingest "$BEIR" --index "$sci_hot" --force
  "$PY" benchmarks/bench_rerank.py --part quality --train-report "$LOGS/rerank-train-$NAME.json" \
    --cross "$(basename "$HOTPOT") ($HOTPOT_SPLIT), head trained on $NAME=$HOTPOT:$HOTPOT_SPLIT:$hot" \
    --cross "$NAME ($SPLIT), head trained on $(basename "$HOTPOT")=$BEIR:$SPLIT:$sci_hot:$hot_head" \
    --json "$RESULTS/rerank.json"
}
step_rerank-latency() {  # the rerank and embed stages, /v1/query rerank off vs on, index size, int8 vs float32
  # MaxSim products on the rerank step's indexes (a quiet machine)
  local hot=$INDEX_ROOT/$(basename "$HOTPOT")-tokens products=()
  local sci_hot=$INDEX_ROOT/$NAME-tokens-$(basename "$HOTPOT")-head hot_head=$LOGS/rerank-head-$(basename "$HOTPOT").npz
  if [ "${SMOKE:-0}" != 1 ]; then
    products+=(--product "$NAME ($SPLIT), shipped head=$BEIR:$SPLIT:$INDEX_ROOT/$NAME-tokens")
    [ -d "$hot" ] && products+=(--product "$(basename "$HOTPOT") ($HOTPOT_SPLIT), shipped head=$HOTPOT:$HOTPOT_SPLIT:$hot")
    [ -d "$sci_hot" ] && [ -f "$hot_head" ] && \
      products+=(--product "$NAME ($SPLIT), head trained on $(basename "$HOTPOT")=$BEIR:$SPLIT:$sci_hot:$hot_head")
  fi
  "$PY" benchmarks/bench_rerank.py --part latency --index "$INDEX_ROOT/$NAME-tokens" --beir "$BEIR" --split "$SPLIT" \
    "${RERANK_LATENCY_ARGS[@]}" "${products[@]}" --json "$RESULTS/rerank-latency.json"
}
step_growth() { "$PY" benchmarks/bench_growth.py --index "$INDEX" --queries "$BEIR/queries.jsonl" "${GROWTH_ARGS[@]}" \
                  --work "$LOGS/growth" --results-file "$RESULTS/growth.json"; }
step_token-codes() {  # product-coded token vectors against int8 on the indexes of the eval and graph steps
  "$PY" benchmarks/bench_token_codes.py --set "$NAME=$BEIR:$SPLIT:$INDEX" \
    --set "$(basename "$HOTPOT")=$HOTPOT:$HOTPOT_SPLIT:$INDEX_ROOT/$(basename "$HOTPOT")" \
    --results-file "$RESULTS/token-codes.json"
}
step_answers() { "$PY" benchmarks/bench_answers.py "${ANSWERS_ARGS[@]}" --json "$RESULTS/answers.json"; }
step_cache() { "$PY" benchmarks/bench_cache.py --beir "$BEIR" --split "$SPLIT" --index "$INDEX" "${CACHE_ARGS[@]}" \
                 --json "$RESULTS/cache.json"; }
step_capacity() { "$PY" benchmarks/bench_capacity.py --index "$INDEX" --queries "$BEIR" "${CAPACITY_ARGS[@]}" \
                    --results-file "$RESULTS/capacity.json"; }
step_steering() { "$PY" benchmarks/bench_steering.py --index "$INDEX" --queries "$BEIR" "${STEERING_ARGS[@]}" --work "$LOGS/steering" \
                    --results-file "$RESULTS/steering.json"; }
step_batching() { "$PY" benchmarks/bench_batching.py --index "$INDEX" --queries "$BEIR/queries.jsonl" \
                    "${BATCHING_ARGS[@]}" --results-file "$RESULTS/batching.json"; }
step_replicas() { "$PY" benchmarks/bench_replicas.py --index "$INDEX" --queries "$BEIR/queries.jsonl" \
                    "${REPLICAS_ARGS[@]}" --work "$LOGS/replicas" --results-file "$RESULTS/replicas.json"; }
step_hyde() { "$PY" benchmarks/bench_hyde.py "${HYDE_ARGS[@]}" --json "$RESULTS/hyde.json"; }  # starts vLLM itself
step_tune() { "$PY" benchmarks/bench_tune.py "${TUNING_ARGS[@]}" --scifact "$BEIR:$SPLIT:$INDEX" \
                 --hotpot "$HOTPOT:$HOTPOT_SPLIT:$INDEX_ROOT/$(basename "$HOTPOT")" --out "$LOGS/tune" --results "$RESULTS"; }
step_judge() { "$PY" benchmarks/bench_judge.py "${JUDGE_ARGS[@]}" --json "$RESULTS/judge.json"; }
step_tune-vllm-real() {  # the same sweep on the real model scripts/install_vllm.sh converts
  "$RH" tune-vllm --model "$MODELS/SmolLM2-135M-Instruct" "${TUNE_REAL_ARGS[@]}" --out "$LOGS/tune-vllm-real" \
    --results-file "$RESULTS/tune-vllm-real.json"
}
step_boards-llm() {  # the vLLM and Kernel boards' pictures under the real model: `stack up` (vLLM serving SmolLM2,
  # the probes as root), open-loop load at the model's pace, then a snapshot of the last minutes
  local folder="$LOGS/boards-llm-stack" api prom minutes
  api=$("$PY" -c 'from rag.childproc import free_port; print(free_port())')
  prom=$("$PY" -c 'from rag.childproc import free_port; print(free_port())')
  "$RH" stack up --index "$INDEX" --folder "$folder" --vllm-model "$MODELS/SmolLM2-135M-Instruct" --api-port "$api" \
    --prometheus-port "$prom" --alertmanager-port 0 --alert-receiver-port 0 --vllm-port 0 --probes-port 0 || return 1
  # shellcheck disable=SC2064
  trap "\"$RH\" stack down --folder \"$folder\" >/dev/null 2>&1 || true" EXIT  # each step runs in its own subshell
  "$RH" bench --url "http://127.0.0.1:$api" "${BOARDS_LLM_ARGS[@]}" --queries "$BEIR/queries.jsonl" \
    --out "$LOGS/boards-llm-bench" || return 1
  minutes=$("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(max(1, round(sum(s["duration_s"] + d["warmup_s"] for s in d["steps"]) / 60 + 0.5)))' \
    "$LOGS/boards-llm-bench/results.json")
  "$RH" dashboards snapshot --prometheus "http://127.0.0.1:$prom" --out "$BOARDS_LLM_OUT" --minutes "$minutes" \
    --rate-window 1m --step 5 --boards vllm,kernel
}
step_milvus() { "$PY" benchmarks/bench_milvus.py --beir "$BEIR" --split "$SPLIT" --index "$INDEX" \
                  --results-file "$RESULTS/milvus.json"; }
step_vllm-ttft() { "$PY" benchmarks/bench_vllm_ttft.py --index "$INDEX" --beir "$BEIR" "${TTFT_ARGS[@]}" \
                     --json "$RESULTS/vllm-ttft.json"; }
step_render() {
  if [ "$RESULTS" = benchmarks/results ]; then "$PY" benchmarks/render_docs.py; else
    "$PY" benchmarks/render_docs.py --results "$RESULTS" --out "$RESULTS/benchmarks.md"; fi
}

ALL=(ingest eval eval-fp32 fusion query quiet-case quality-signals quality-drill telemetry telemetry-recording observe loadgen knee examples explain explain-cold-cache explain-example ann probes
     tune-vllm tune-vllm-real boards-llm embedding graph routing vllm-ttft rerank rerank-latency growth token-codes milvus cache capacity steering batching replicas answers hyde judge tune render)
if [ "${1:-}" = --list ]; then printf '%s\n' "${ALL[@]}"; exit 0; fi
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${ALL[@]}")
mkdir -p "$RESULTS" "$LOGS"
failed=()
for step in "${steps[@]}"; do
  declare -F "step_$step" >/dev/null || { echo "unknown step $step; steps: ${ALL[*]}" >&2; exit 2; }
  echo "== $step ($(date -u +%H:%M:%S) UTC)"
  start=$SECONDS
  set +e
  ( set -e; "step_$step" ) 2>&1 | tee "$LOGS/$step.log"
  status=${PIPESTATUS[0]}
  set -e
  echo "== $step: exit $status after $((SECONDS - start)) s"
  [ "$status" = 0 ] || failed+=("$step")
done
[ ${#failed[@]} -eq 0 ] || { echo "FAILED: ${failed[*]} (logs in $LOGS)"; exit 1; }
