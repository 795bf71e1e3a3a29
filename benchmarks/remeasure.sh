#!/usr/bin/env bash
# Every command whose numbers README.md and docs/ print from the embedded default (benchmarks/REMEASURE.md,
# group 1), each run once into OUT/<name>.log with its wall time; a command that finished (OUT/<name>.done)
# is not run again, so the script resumes where it stopped. Run from the repository root with the
# package installed, once per core you give it: each copy takes the next command no other copy holds
# (OUT/<name>.claim, released when its process is gone), so two copies share the list.
#
#     bash benchmarks/remeasure.sh OUT              # every command, one after another
#     bash benchmarks/remeasure.sh OUT > a.log &    # two copies side by side, one per core
#     bash benchmarks/remeasure.sh OUT > b.log &
#     REMEASURE_SKIP="robustness_full canonical" bash benchmarks/remeasure.sh OUT   # leave some out
#
# Timing benchmarks (trace, likelihood, hook overhead, costs, executors, threads) come first, so that
# the other copy is running its first command beside them at most; the pages say which numbers are
# ratios from one run on a shared machine. `timerome build-default --check` (about 97 minutes) is not
# run. Commands that need a file made by another (the edit memories, the trace) make it in OUT/work
# first. `timerome edit` without --trace edits the model's default coordinate, with --trace the trace's
# best (both layer 1 resid on the two-stage embedded build; layer 1 and layer 0 on the stage-1 build):
# each command as its page gives it.
set -u
OUT=${1:?usage: remeasure.sh OUT}
mkdir -p "$OUT/work"
OUT=$(cd "$OUT" && pwd)
ROOT=$(pwd)
DATA=${TIMEROME_BENCH_DATA:-$ROOT/../shared/data}
SKIP=" ${REMEASURE_SKIP:-} "

claim() {  # claim NAME: true when this process now holds NAME (no live process holds it)
    local dir="$OUT/$1.claim"
    if mkdir "$dir" 2>/dev/null; then echo $$ > "$dir/pid"; return 0; fi
    local holder
    holder=$(cat "$dir/pid" 2>/dev/null || echo "")
    if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null; then return 1; fi
    rm -rf "$dir"  # its process is gone (killed, or the machine stopped): take it over
    mkdir "$dir" 2>/dev/null && echo $$ > "$dir/pid"
}

run() {  # run NAME COMMAND...: in OUT/work, logged; skipped when done, skipped, or held by another copy
    local name=$1
    shift
    if [ -e "$OUT/$name.done" ] || [[ "$SKIP" == *" $name "* ]] || ! claim "$name"; then
        return 0
    fi
    echo "[$(date +%H:%M:%S)] $name: $*"
    local t0=$SECONDS
    (cd "$OUT/work" && "$@") > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "rc=$rc wall_s=$((SECONDS - t0)) command: $*" >> "$OUT/$name.log"
    if [ $rc -eq 0 ]; then touch "$OUT/$name.done"; else echo "  FAILED (rc $rc): $OUT/$name.log"; fi
    rm -rf "$OUT/$name.claim"
}

B=$ROOT/benchmarks
# timing first
run trace               python "$B/bench_trace.py"
run likelihood          python "$B/bench_likelihood.py" --threads 1 --models embedded --head masked,full,masked,full --repeats 3
run hook_overhead       python "$B/bench_edit_memory.py" --parts overhead --repeats 3 --gen-length 32 --overhead-models embedded
run hook_scale          python "$B/bench_edit_memory.py" --parts overhead,scale --overhead-models embedded
run install             python "$B/bench_edit_memory.py" --parts install --threads 1
run selectivity_costs   python "$B/bench_selectivity.py" --models embedded --seeds 0 --parts costs --threads 1 --no-progress
run gate                python "$B/bench_edit_memory.py" --parts gate
run executors           python "$B/bench_executors.py"
run threads             python "$B/bench_threads.py" --n-facts 8 --repeats 1 --busy 0,1
run malloc              python "$B/bench_malloc.py" --pairs 4
run fingerprint         python "$B/bench_fingerprint.py"
# what the model says and the tables
run default_model       python "$B/bench_default_model.py" --slack 4,24 --json default_model.json
run demo                env TIMEROME_CACHE="$OUT/work/fresh-cache" timerome demo
run canonical           timerome experiment canonical --fresh -o canonical
run edit_and_generate   bash -c 'timerome edit -o forget.safetensors && timerome edit --method rewrite -o rw.safetensors \
    && timerome requests counterfactual:forget10 -o cf.json && timerome edit --method rewrite --requests cf.json -o rwcf.safetensors \
    && for m in forget rw; do timerome generate --edit $m.safetensors "Where was Isgor Quielson born ?" \
         "Which award did Isgor Quielson win ?" "Where was Marhar Miostine born ?"; done \
    && timerome generate --edit rwcf.safetensors "What is the latest book of Danra Mirodard ?" \
         "Which book did Danra Mirodard publish last ?" "How many books has Danra Mirodard written ?" \
         "What is the latest book of Torcor Barsefine ?"'
run eval_example        bash -c 'timerome trace -o trace/ && timerome edit --trace trace/trace.safetensors -o forget-traced.safetensors \
    && timerome eval --edit forget-traced.safetensors --n-mc 2 --n-retain 4 --n-world 2 --no-rouge --json \
    && timerome eval --n-mc 2 --n-retain 4 --n-world 2 --no-rouge --json'
run key_metric          python "$B/bench_edit_memory.py" --parts selectivity --threads 1
run operating_point     python "$B/bench_operating_point.py" --alphas 1,1.5,2,4
run operating_point_f05 python "$B/bench_operating_point.py" --authors forget05 --alphas 1.5,4
run editing             python "$B/bench_editing.py" --json editing.json
run extraction          python "$B/bench_extraction.py" --json extraction.json
run selectivity_readme  python "$B/bench_selectivity.py" --models embedded --methods no_edit,codebook,rome,timerome,rewrite --seeds 0,1,2 --no-progress
run frontier            python "$B/bench_selectivity.py" --threads 1 --models embedded --seeds 0,1,2 --parts frontier --json sel.json --png sel.png --no-progress
run robustness_parts    python "$B/bench_selectivity.py" --parts robustness --models embedded --seeds 0 --threads 1 --no-progress
run directions          python "$B/bench_selectivity.py" --parts directions --models embedded --seeds 0 --threads 1 --no-progress
run generations         python "$B/bench_selectivity.py" --parts generations --models embedded --seeds 0 --no-progress
run robustness_quick    timerome --threads 1 experiment robustness --quick -o robustness-quick
run positional          timerome --threads 1 trace --positional --compare -o emb/
run ablations           timerome --threads 1 experiment ablations -o abl/
run ablations_seeds     timerome --threads 1 experiment ablations --seeds 0,1,2 -o ablations/
run readout            bash -c 'for s in 0 1 2; do for r in all no_subject; do timerome --threads 1 trace --seed $s \
    --read-positions $r -o readout/s$s-$r; done; done && for r in all no_subject; do timerome --threads 1 edit \
    --trace readout/s0-$r -o readout/m-$r.safetensors && timerome --threads 1 eval --edit readout/m-$r.safetensors --json; done'
run pareto_frontiers    timerome --threads 1 experiment pareto --methods no_edit -c '{"frontiers": [{}, {"coordinate": [0, "resid"]}]}' -o pareto-frontiers/
run npo_sweep           timerome --threads 1 experiment npo_sweep --seeds 0,1,2 -o npo_sweep/
run transfer_quick      timerome --threads 1 experiment transfer --quick --bench-data "$DATA" --seeds 0 -o transfer-quick
run rwku_quick          timerome --threads 1 experiment rwku --quick --bench-data "$DATA" -o rwku-quick
run locate_sweep        timerome experiment editing --config "$B/editing_locate_sweep.json" --seeds 0 --out sweep/
run rouge_caches        python "$B/bench_generation.py" --parts rouge
run bare_objects        python "$B/bench_bare_objects.py"
# the longest (about an hour alone), last
run robustness_full     timerome --threads 1 experiment robustness -o robustness/
# the radar reads npo_sweep/, ablations/ and robustness/ (docs/scale.md): after them
run radar               timerome experiment radar -o radar/
echo "done: $(ls "$OUT"/*.done 2>/dev/null | wc -l) commands finished in $OUT"
