#!/usr/bin/env bash
# The CPU benchmark runs behind docs/benchmarks.md's headline table, one after another on a quiet
# machine (nothing else may run meanwhile: every ratio would be distorted). About 70 minutes on
# the 2-core CI machine. Each run writes bench/NAME.txt (the report), .log (progress), .json.
# The greedy budget is the default (2,048 tokens a batch); the sweep adds 1,024 and 4,096.
set -u
cd "$(dirname "$0")/.."
M=${MODEL:-weights/qwen2.5-0.5b-synthetic}
run() {
    name=$1; shift
    echo "$(date +%T) $name: mlxbatch bench --model $M $*"
    mlxbatch bench --model "$M" "$@" --json "bench/$name.json" >"bench/$name.txt" 2>"bench/$name.log"
    echo "$(date +%T) $name: exit $?"
}
run default-120 --tickets 120 --modes gold,sorted,greedy,sweep --sweep 1024,4096 \
    --plot bench/default-120.png
run fewshot-120 --tickets 120 --prompt few-shot --modes gold,sorted,greedy,sweep --sweep 1024,4096 \
    --peers transformers,transformers-bf16
run heavytail-120 --tickets 120 --mix heavy-tail --prompt descriptions \
    --modes gold,sorted,greedy,sweep --sweep 1024,4096
run default-600 --tickets 600 --modes gold,sorted --no-peers --plot bench/default-600.png
# how time and peak memory grow with the job: 600 and 6,000 tickets, the fast path alone
run default-600-sorted --tickets 600 --modes sorted --no-peers
run default-6000 --tickets 6000 --modes sorted --no-peers
