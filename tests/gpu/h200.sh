#!/usr/bin/env bash
# The H200 runs of a session, one device call each (the device tool: 600 s a call, logs under
# $OUT). Run from the tree's root:  bash tests/gpu/h200.sh PART [PART ...]
#   kernels   the GPU kernel tests (references at the 0.8B shapes, the padded step's kernels)
#   engine    the engine GPU tests (graphs on/off, plan ahead, padded steps, row check)
#   padded    the padded steps' greedy tokens with graphs on and off, both backends
#   varlen    the padded steps' attention with its keys split (varlen_splits): the kernel
#             against the reference at the 0.8B shapes and 1/3/8 splits, the padded steps'
#             tokens with graphs on and off under varlen_splits=auto, then
#             tests/gpu/time_varlen.py (its µs by split count for a prefix hit, a hit beside 16
#             decode rows and a fresh 2,048-token prompt)
#   bench     resident.tools.bench at c=1/16/64/256 with the burst row (this tree's defaults)
#   bench-sampled  resident.tools.bench at c=64, greedy then temperature 0.7 / top_p 0.9 (issue
#             36: the draw's share of an in-process step), each with its step's Python profile
#             (--cprofile), tarred to bench-sampled.tgz
#   burst     the burst row and c=1 alone (the fresh prompt's prefill)
#   budget    the burst at prefill_token_budget 4096/8192
#   rowcheck  the row check under KV and slot pressure
#   gate      configs/gate/h200-0.8b-padded.yaml (padded prefill against the eager path), tarred
#   profile   configs/gate/h200-0.8b-profile.yaml (four arms' profile windows, issue 20), tarred
#   planted   configs/gate/h200-0.8b-planted.yaml (a planted slowdown and an A/A copy, issue 21)
#   budget-served  configs/gate/h200-0.8b-budget.yaml (the served prefill budget sweep, issue 18)
#   served    $SERVED (default results/2026-12-02-h200-0.8b-dense/served.yaml: 2048 against
#             8192 at c=16/64/256) up to $ROUNDS rounds in all (default 1), tarred to
#             gate-served.tgz; a gate-served.tgz at the tree's root (from a call before: carry
#             it) is resumed, so rounds add up. SERVED=configs/gate/h200-0.8b-aa.yaml: the A/A
#             pair at c=64 (issue 18's gate noise), 3 rounds a call; SERVED_LIMIT: its seconds
#             (default 560), to leave room for other parts in the call
#   gate-planner  configs/gate/h200-0.8b-planner-ahead.yaml's four arms (resident planning
#             off/auto x flashinfer/triton, plan_ahead=launch) at $CONC (default 1,16,64), their
#             servers up together with 4 GiB of KV each, $PLANNER_ROUNDS rounds (default 5),
#             tarred
#   check     configs/gate/check-h200-0.8b.yaml's greedy and concurrency sweeps against the tree
#             at .gate/worktrees/main-dc7131b (carried: git worktree add --detach ... dc7131b)
#   check-2b  the same at qwen3.5-2b (configs/gate/check-h200-2b.yaml)
#   tuned     the chunked delta rule against fla, the split GDN, and the start-up tuning
#   fused-kernels  the fused decode kernels (GDN layer, attention prologue) and the PDL
#             launches (GEMV, decode attention), the rows' argmax, against their references
#             at the real shapes (the GEMV's float32 at full precision among them), the
#             add + norm kernel at the 2B-9B widths
#   arms      the bench at $CONC (default 1,16,64,256; a burst of $BURST prompts, default
#             none) of $MODEL (default qwen3.5-0.8b) for each of $ARMS, one Triton cache:
#             bench-<arm>.json ('@' as '_'). fused: this tree's defaults; off:
#             fused_decode=off pdl=off gemv_table=off; nopdl: pdl=off; pdlonly:
#             fused_decode=off; wide: decode_gemm=wide; full: fused_decode=full (the epilogues
#             in the kernels before them); fullnopdl: both full and nopdl (each
#             kernel's µs its own: PDL's early launch puts the wait for the kernel before
#             into a kernel's time); nosplits:
#             decode_splits=off (8 key splits in every bucket); PROMPT_LEN: the prompts'
#             tokens (default 512; the JSON's name then ends -p<len>); rule: gemv_table=off
#             (the defaults read a committed table);
#             torchargmax: argmax=torch (the greedy tokens on torch's reduction, not
#             kernels/argmax.py); bf16state: gdn_state_dtype=bfloat16; <arm>@base: that arm's knobs run from the source tree $BASE
#             (fused@base: its defaults; carried: git archive <ref> resident configs | tar -x
#             -C .gate/worktrees/base-<ref>); <arm>@<name>: from .gate/worktrees/<name>;
#             a name ending in a digit repeats its arm (fused2, table2); an arm of another
#             name runs the defaults; ARM_LIMIT: an
#             arm's seconds (default 170; the first arm's 120 more: it compiles, unless
#             ARMS_CACHE names a tarball of the Triton and Inductor caches of a call
#             before: carry it, e.g. .gate/arms-cache.tgz; its autotuning picks stand for
#             this call's, the same for every arm); ARMS_CACHE_SAVE=1: the caches as
#             $OUT/arms-cache.tgz at the end, for the next call;
#             table: gemv_table=$GEMV_TABLE (default $OUT/gemv-<model>.json: run gemv-sweep
#             first, same call; a table from a call before: commit it, point GEMV_TABLE at it);
#             fulltable: both
#   check-fused  configs/gate/check-h200-0.8b-fused.yaml (the fused decode against the separate
#             kernels, greedy and concurrency), tarred
#   check-fused-fp32  the same in float32 (configs/gate/check-h200-0.8b-fused-fp32.yaml;
#             $MODEL, default qwen3.5-0.8b: qwen3.5-2b for issue 33's 2B check), tarred
#   parity-fused the decode paths' logits against fp32, teacher-forced (fused_decode among them)
#   state-bf16  gdn_state_dtype=bfloat16's GPU tests: the decode, layer and chunk-state kernels on
#             a bf16 pool at the real shapes, and its logits against fp32 teacher-forced for 64
#             steps beside the fp32 state's (issue 33)
#   time-gdn-decode  tests/gpu/time_gdn_decode.py: the GDN decode delta rule's µs at 64 and 256
#             rows by state dtype, value columns a program and warps
#   time-add-norm  tests/gpu/time_add_norm.py: a decode add + norm's µs a call, Inductor's
#             against kernels/add_norm.py, at 1,024-4,096 columns, 1 and 16 rows
#   check-state-bf16  configs/gate/check-h200-0.8b-state-bf16-fp32.yaml (bf16 state against fp32
#             in a float32 model, greedy and concurrency), tarred
#   gate-state-bf16  configs/gate/h200-0.8b-state-bf16.yaml (bf16 against fp32 state served at
#             c=16/64/256, both servers up together, until a verdict or 3 rounds), tarred
#   gate-fused   configs/gate/h200-0.8b-fused.yaml (fused against off, c=1/16/64, interleaved,
#             until a verdict), tarred
#   gemv-sweep  resident.tools.bench_gemv at the projections of each of $GEMV_MODELS (default
#             qwen3.5-0.8b), rows $GEMV_ROWS (1,4), tiles $GEMV_TILES (fma: the CUDA-core form;
#             dot, all) against cuBLAS, cold weights: gemv-<model>.json and .log
#   gemv-medium  bench_gemv at $MODEL's (default qwen3.5-0.8b) projections at the buckets of
#             17-256 rows ($GEMV_ROWS, default 32,64; $GEMV_TILES, default dot: there the
#             wgmma tiles of each row class; wgmma: the 64-row ones at 16 rows too) against cuBLAS:
#             gemv-medium-<model>.json, then that sweep added to this GPU's committed table
#             (configs/gemv/<GPU name>.json, if any) as gemv-merged-<model>.json: point
#             GEMV_TABLE at it for the arms part's `table` arm, same call
#   gemv-pick  gemv-medium at $GEMV_ROWS (default 32,64,128), every entry at those rows picked
#             to the Triton GEMV (resident.tools.pick_gemv_table: in a step its PDL launch can
#             beat cuBLAS where cuBLAS won alone), the arms fused / table(picked) twice at
#             those concurrencies, then confirm_gemv_table of the picks against the committed
#             table: gemv-pick-confirmed-<model>.json, to merge into configs/gemv/<GPU>.json
#   gemv-chain  bench_gemv --pdl (the Triton tiles launched as a step launches them: under PDL,
#             a closing projection's K splits left unsummed) at $MODEL's (default qwen3.5-0.8b) projections: rows
#             $GEMV_FMA_ROWS (default 1) over the CUDA-core tiles, then $GEMV_ROWS (default
#             32,128,256) over each row class's wgmma tiles: gemv-chain-fma-<model>.json and
#             gemv-chain-<model>.json, and their .log
#   gemv-table  a gemv table for this GPU, confirmed in whole steps: bench_gemv at $MODEL's
#             (default qwen3.5-0.8b) projections, rows $GEMV_ROWS (1,2,4,8,16) ($GEMV_TILES:
#             fma, the default, or dot or all, beside the engine's own tiles; engine: those
#             alone; the Triton tiles timed as a PDL chain, --pdl, unless GEMV_PDL=0: alone
#             they lost where the step wanted them, results/2026-12-07-h100-gemv-chain), then
#             the bench at c=$GEMV_ROWS with
#             gemv_table=off (rule) and =the sweep (table), then resident.tools.confirm_gemv_table:
#             gemv-table-<model>.json holds the row counts the steps confirmed (commit it as
#             configs/gemv/<GPU name>.json, merged with other models' entries)
#   gate-addnorm configs/gate/h200-0.8b-addnorm.yaml (fused_decode=full against the defaults,
#             c=1/16, interleaved, until a verdict), tarred
#   modes     configs/gate/h200-0.8b-c1-modes.yaml (an A/A pair with profile windows) in each
#             of $MODES (default: sequential interleaved; interleaved-serial: --interleave
#             without --parallel-start), issue 39, tarred to modes.tgz
#   chat      the chat API on a CUDA server of qwen3.5-0.8b (tests/gpu/test_chat_gpu.py: greedy
#             n=4 identical, stream equal to the answer, a stop string across tokens, 16 x n=4
#             sampled streams to the end; the log prints their tok/s)
#   api-profile  the API processes' CPU µs per streamed token, 0.8B served at c=64 and c=256
#             with one API process, and c=256 with two (gate.tools.api_profile; issue 35
#             asks <= 15 µs a token and no process above 0.7 of a core), tarred to api-profile.tgz
#   host-probe  tests/gpu/host_probe.py: this host's µs for a Python call, a system call, a
#             socket send + recv, an epoll wait, an unpickle and a JSON encode (beside the VM's)
#   core-spy  the engine core sampled by py-spy with its C frames (CUDA's driver calls among
#             them), 0.8B served at c=64, greedy then temperature 0.7 / top_p 0.9
#             (gate.tools.api_profile --spy core --native; issue 36: where the sampler's host
#             time goes on a GPU host), stacks and logs tarred to core-spy.tgz
#   api-spy   api-profile at c=64 and c=256 with the API process pinned (api_core=0) and sampled
#             by py-spy (a static binary carried as .whl/bin/py-spy: the host has none): the top
#             functions in api-spy-c<c>.log, the stacks tarred to api-spy.tgz; API_SPY_NATIVE=1:
#             with C frames (the send system call's share; py-spy stops the process a sample)
#   api-synthetic  the API process alone at GPU token rates on this host's CPUs: api_profile
#             --synthetic-decode (the tiny model, the core's decode forward skipped) at c=64 and
#             c=256, the tool and its server on CPUs 0-5, the API process on CPU 0 (api_core),
#             so the core's CPU torch threads stay off it (results/2026-12-04-cpu-api-synthetic)
#   load-client  the gate's load client alone against the fake SSE server
#             (gate.tools.load_client_bench): asked for 5x 45k tok/s at c=256 (issue 35 asks
#             it sustains 4x: asked for exactly 4x it can only show less), unpaced, and at the
#             c=256 cell's pace (45k) with the
#             gate's two processes there (its µs a token at a served stream's one event a read);
#             the three logs tarred to load-client.tgz
#   gate-frontend  configs/gate/h200-0.8b-frontend.yaml (an A/A pair at c=64/256, both servers
#             up together: the summary's CPU table and pacing line), tarred
#   gate-event-loop  configs/gate/h200-0.8b-event-loop.yaml (the API process on uvloop against
#             asyncio's loop at c=64/256, both servers up together), tarred; UNTIL=N: rounds
#             until every cell has a verdict, at most N (the config's one round otherwise)
#   load-client-loops  the load client alone against the fake server at the c=256 cell's pace
#             (45k tok/s, 2 processes), on asyncio's loop and on uvloop, alternated twice:
#             load-client-loops.log
#   served-ratio  issue 35's served-equivalent ratio (gate.tools.served_ratio), 0.8B, 512 in
#             and 256 out, at each c of $SERVED_RATIO_CONC (default "64 256"; one a call if
#             the call's 600 s cannot hold both: ~5 min each), ~60 s of load a half: 5,632
#             requests at c=64, 9,216 at c=256; served-ratio-c<c>.log holds the JSON, the
#             logs of both halves are under served-ratio-c<c>/
#   ttft-prefix  where a prefix hit's TTFT goes: gate.tools.served_ratio at each c of
#             $TTFT_CONC (default "16 64"), a shared 1,024-token prefix + 256 own, 256 out, 4
#             requests a slot, prefix_cache on and off (one Inductor cache for all):
#             ttft-<on|off>-c<c>.log holds the JSON (TTFT p50 in process and served);
#             TTFT_RATES="25 45" (one a c, in order): open loop at those requests a second
#   hit-phases  a prefix hit's host phases and TTFT in process (resident.tools.hit_phases, 0.8B,
#             c=1, a shared 1,024-token prefix + 256 own, no HTTP and no pipe): hit-phases.log;
#             then the same prompts with prefix_cache=off (every prompt's 1,280 tokens computed):
#             hit-phases-off.log (issue 37: the TTFT ratio the engine alone gives)
#   prefix-engine  the prefix cache in the engine (tests/gpu/test_prefix_gpu.py: a second pass
#             repeats the first bit for bit, hits, row check 0, everything returns)
#   check-prefix  configs/gate/check-h200-0.8b-prefix.yaml (--sweep prefix: the cache off, on,
#             on again against main with it off), tarred; main is the tree at
#             .gate/worktrees/main-ea55939 when carried, else this tree (the cache off)
#   check-prefix-2b  the same at qwen3.5-2b (configs/gate/check-h200-2b-prefix.yaml)
#   check-prefix-fp32  the same in float32 (configs/gate/check-h200-0.8b-prefix-fp32.yaml)
#   check-prefix-2b-fp32  check-prefix-2b in float32 (--set dtype=float32 on every server)
#   soak      issue 37's leak run (gate.tools.soak): 0.8B, prefix_cache=on, row_check=on, c=64,
#             8 shared 1,024-token prefixes + up to 256 own, up to 256 out, every 8th client
#             hanging up, $SOAK_S seconds of load (default 600); then nothing may be held
#   soak-start  the same in its own process session (setsid), which outlives the call while
#             the machine stays warm: start it, run correctness parts beside it, and collect
#             it with soak-wait in this call or the next (no timing part may run beside it)
#   soak-wait  waits for soak-start's run (up to $SOAK_WAIT_S, default 560) and copies its
#             output to $OUT/soak.log and its server log to $OUT/soak-server.log
#   gate-prefix  configs/gate/h200-0.8b-prefix.yaml (on against off, a shared 1,024-token
#             prefix + 256 own, c=16/64, until a verdict), tarred
#   gate-prefix-none  configs/gate/h200-0.8b-prefix-none.yaml (the same without a shared
#             prefix: the cache's cost), tarred
#   gate-prefix-tail  configs/gate/h200-0.8b-prefix-tail.yaml (off, on, and on with the tail
#             snapshot, shared prefix as gate-prefix), tarred
#   gate-prefix-long  configs/gate/h200-0.8b-prefix-long.yaml (on against off, 4,000-token
#             fresh prompts at c=1/16: the cut's TTFT cost), tarred
#   gate-prefix-open  configs/gate/h200-0.8b-prefix-open.yaml (gate-prefix's load open loop:
#             Poisson arrivals at 25 and 45 requests/s, c=16/64 the most in flight), tarred
#   gate-prefill-buckets  configs/gate/h200-0.8b-prefill-buckets.yaml (padded prefill buckets
#             a 1.5x ladder apart against powers of two, gate-prefix-open's load), tarred
#   gate-gemv-table  configs/gate/h200-0.8b-gemv-table.yaml (the committed gemv table of this
#             GPU against decode_gemm's rule, c=1 served, interleaved), tarred
#   gate-varlen-splits  configs/gate/h200-0.8b-varlen-splits.yaml (the padded steps' attention
#             with its keys split, varlen_splits=auto, against off, gate-prefix-open's load,
#             judged on TTFT), tarred
#   gate-decode-splits  configs/gate/h200-0.8b-decode-splits.yaml (the decode attention's keys
#             split by bucket, decode_splits=auto, against 8 splits, served c=1/4 with
#             4,096-token prompts, until a verdict), tarred
#   decode-tiles  the wide buckets' decode attention tile: its GPU test, the kernel by bucket
#             (bench_attention, 640 and 4,096 keys), the step against the tree before it
#             (arms; carry .gate/worktrees/base-6e15366), issue 33
#   gate-decode-tiles  configs/gate/h200-0.8b-decode-tiles.yaml (the decode attention's
#             wide-bucket tile against the tree before it, carried as
#             .gate/worktrees/base-6e15366; c=64/256), tarred
#   gate-targets  configs/gate/h200-0.8b-targets.yaml (issue 33's served cells c=1/16/64/256:
#             the defaults against fused_decode=off pdl=off gemv_table=off and against the bf16
#             GDN state, three servers up together, until a verdict or 3 rounds), tarred
#   gate-gc-young  configs/gate/h200-0.8b-gc-young.yaml (the engine core's young GC threshold at
#             Python's 700 against gc_young_threshold's default, c=64/256, until a verdict or
#             4 rounds), tarred
#   check-late-launch-fp32  configs/gate/check-h200-0.8b-late-launch-fp32.yaml (late_launch on
#             against off, greedy and concurrency sweeps in float32), tarred
#   gate-late-launch  configs/gate/h200-0.8b-late-launch.yaml (late_launch on against off,
#             closed loop c=16/64: tok/s and TTFT), tarred
#   gate-late-launch-prefix  configs/gate/h200-0.8b-late-launch-prefix.yaml (issue 37's open-loop
#             prefix cells: the cache off and on under late_launch, and on with it off), tarred
#   gate-idle-spin  configs/gate/h200-0.8b-idle-spin.yaml (core_idle_spin on against off, c=1,
#             one prefix hit at a time: read TTFT and the queue split), tarred
#   profile-varlen  configs/gate/h200-0.8b-varlen-profile.yaml (a prefix hit's prefill step
#             profiled at c=1, varlen_splits off and auto), then resident.tools.kernel_gaps
#             over the two kept traces' prefill replays (profile-varlen-gaps.log) and the
#             off trace's largest gaps alone (profile-varlen-top.log); the session
#             tarred without its traces, one trace of each arm trimmed to 70 steps (a prefill
#             among them) into profile-varlen-traces.tgz
#   sampler   tests/gpu/test_sampler_gpu.py: FlashInfer's filter and the Triton race against
#             torch's filter, a seeded request alone (eager, host-planned) against among 15
#             (the drawing decode graphs, resident slots and host-planned), torch and triton, and
#             the varlen draw graphs against the eager draw;
#             then tests/gpu/time_draw.py: a captured draw's GPU time at the 0.8B vocabulary,
#             each filter, at 1/16/64/256 rows, beside the argmax alone, and the race's
#             kernels and the host's µs a call (eager, replayed) at 64 rows (sampler-time.log). SAMPLER_K: a pytest -k filter ("not
#             flashinfer" skips FlashInfer's minutes of JIT build on a fresh machine); SAMPLERS:
#             time_draw's samplers (default torch triton flashinfer)
#   time-gdn-layer  tests/gpu/time_gdn_layer.py: a GDN layer decode's GPU time at the 0.8B's
#             heads, the fused kernel by a program's value columns, warps and register cap,
#             and the separate kernels (sep), at 1, 4, 8 and 16 rows; GDN_LAYER_ARGS: its
#             arguments (e.g. --rows 16,64,256 --configs sep,32x4,64x4,128x8) (issue 33)
#   ring      tests/test_token_ring.py and tests/test_kernel_slot_params.py whole: the publish
#             kernel storing into pinned memory against its torch reference, a replayed graph
#             alternating slots, the CPU engine's ring against its copy (the GPU engine's:
#             tests/gpu/test_sampler_gpu.py); the resident sampling parameters' take kernel
#   bundle    every *.log under $OUT so far into logs.tgz (a call brings back at most 8 files):
#             put it last
#   gate-sampled configs/gate/h200-0.8b-sampled.yaml twice, greedy then sampled (temperature
#             0.7, top_p 0.9), c=64, $SAMPLED_ROUNDS rounds each (default 1; 3 took ~105 s a
#             session on a warm H100): compare the two sessions' output_throughput, tarred
#   phases-sampled configs/gate/h200-0.8b-phases-sampled.yaml: the sampler's host time a step at
#             c=64 sampled, resident planning off and auto, $PHASES_ROUNDS rounds (default 1),
#             tarred; PHASES_BASE=<dir> (a source tree, carried): a third arm `base`, that tree
#             under resident planning, alternated with the two (the same host's before);
#             PHASES_LIMIT: its seconds (default 400)
#   check-seeded configs/gate/check-h200-0.8b.yaml's seeded sweep, this tree against itself
#             (main=. head=.: the old sampler of an earlier main draws other tokens), tarred
#   check-seeded-triton  the same with sampler=triton on every server
#   tp        issue 38 (needs a 2-GPU kind, nvidia-h200-x2): the CPU tensor-parallel tests on
#             the host, then configs/gate/check-h200-9b-tp.yaml's greedy and concurrency sweeps
#             (9B TP2 against TP1 and its yardstick), tarred to check-tp.tgz
#   tp-rows   the same check's rows sweep: the row check on each rank under slot pressure
#             (> 1,000 steps), tarred to check-tp-rows.tgz
#   gate-tp   configs/gate/h200-9b-tp.yaml (TP2 beside TP1 at c=1/16/64), tarred
# Carry .whl/ (../shared/tools/gpu-wheels) with orjson and uvloop wheels added, which the API and
# the load client parse and run their loops with (the host has neither): for each, pip download
#   orjson --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 -d .whl
# and, for api-spy, py-spy's static binary (not a pyenv shim): mkdir -p .whl/bin && \
#   cp "$(pyenv which py-spy 2>/dev/null || command -v py-spy)" .whl/bin/py-spy
# Each part writes $OUT/<part>.log and prints its last lines; a failing part does not stop the
# others. burst, bench and budget start from an empty Triton cache: fla and our state pass keep
# their autotuning picks there, and a part before them (the kernel tests) would have made those
# picks on its own inputs (a kkt solve 1.6x slower in a burst after the kernel tests).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ -f .whl/install.sh ] && [ ! -d /tmp/site/flashinfer ]; then
  # its log comes back only on failure: a call brings back at most 8 files
  bash .whl/install.sh >/tmp/install.log 2>&1 \
    || { echo "wheel install failed"; cp /tmp/install.log "$OUT/install.log"; }
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
# the host's packages carry no bytecode and its environment forbids writing it: without a kept
# cache every Python process here compiles ~2,600 modules (gate/run/bytecode.py)
export PYTHONPYCACHEPREFIX=$PWD/.gate/pycache
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv,noheader >"$OUT/gpu.txt" 2>&1
# the host's clock: every per-token timestamp (load client, API) and every phase lap reads it,
# and a clock source without a vDSO read (not tsc) makes each read a system call
{ echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
  python3 -c 'import time, timeit
for name in ("perf_counter", "monotonic", "thread_time"):
    print(name, round(timeit.timeit(getattr(time, name), number=200000) / 200000 * 1e9), "ns")'
} >>"$OUT/gpu.txt" 2>&1

run() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s"
  tail -n 4 "$OUT/$name.log"
}

# the TTFT and step rows of a served_ratio log (its JSON after any lines the processes wrote)
TTFT_ROWS='import json, sys
text = open(sys.argv[1]).read()
data, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
for row in data["comparison"]:
    if "TTFT" in row["what"] or "step" in row["what"]:
        print(row)'

# a bench_gemv sweep (argv 1) added to this GPU's committed gemv table, written to argv 2
MERGE_TABLE='import json, sys, torch
from resident.backends.gemv_table import shipped_table_path
shipped = shipped_table_path(torch.cuda.get_device_name())
rows = json.loads(shipped.read_text()) if shipped.exists() else []
sweep = json.load(open(sys.argv[1]))
json.dump(rows + sweep, open(sys.argv[2], "w"), indent=1)
print(f"{sys.argv[2]}: {len(rows)} committed entries ({shipped.name}) + {len(sweep)} swept")'

# greedy, then issue 36's sampled load: name, temperature, top_p
DRAWS=("greedy 0 1" "sampled 0.7 0.9")

SOAK_ARGS=(--model qwen3.5-0.8b --device cuda --duration "${SOAK_S:-600}" --concurrency 64
           --format json)

for part in "$@"; do
  case $part in
    kernels)
      run kernels 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernel_*.py \
        tests/gpu/test_padded_gpu.py -k "not padded_steps" ;;
    engine)
      run engine 560 python3 -m pytest -q -m gpu -p no:cacheprovider -x \
        tests/gpu/test_padded_gpu.py::test_padded_steps_give_the_same_tokens_with_and_without_graphs \
        tests/gpu/test_backends_gpu.py -k "replan_does_not_sync or greedy_identical or padded_steps or plan_ahead" ;;
    tuned)
      run tuned 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_kernel_chunk_states.py tests/gpu/test_padded_gpu.py -k "not padded_steps" ;;
    padded)
      run padded 200 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging \
        tests/gpu/test_padded_gpu.py::test_padded_steps_give_the_same_tokens_with_and_without_graphs ;;
    varlen)
      run varlen 300 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging \
        tests/gpu/test_padded_gpu.py -k "varlen_attention or (padded_steps and auto)"
      run varlen-time 150 python3 tests/gpu/time_varlen.py ;;
    decode-tiles)
      # the wide buckets' attention tile (decode_attention.decode_tile): its GPU test at the
      # real shapes, the kernel at the rule's tile by bucket over 640 and 4,096 keys (1-8
      # splits of 16 and 32 keys at 64 and 256 rows there), then arms (default: the tree
      # before it at .gate/worktrees/base-6e15366 against this one, twice, c=32-256)
      run decode-tiles-test 120 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging \
        tests/test_kernel_decode_attention.py
      run decode-tiles-640 90 python3 -m resident.tools.bench_attention \
        --buckets 1,16,24,32,64,128,256 --context 640 --json "$OUT/decode-tiles-640.json"
      run decode-tiles-4096 120 python3 -m resident.tools.bench_attention --buckets 64,256 \
        --context 4096 --splits 1,2,4,8 --block-n 16,32 --json "$OUT/decode-tiles-4096.json"
      BASE=${BASE:-$PWD/.gate/worktrees/base-6e15366} ARMS=${ARMS:-fused@base fused fused2@base fused2} \
        CONC=${CONC:-32,64,128,256} ARM_LIMIT=${ARM_LIMIT:-80} bash "$0" arms ;;
    rowcheck)
      run rowcheck 120 python3 -m pytest -q -m gpu -p no:cacheprovider -p no:logging \
        tests/gpu/test_backends_gpu.py -k row_check_finds_nothing ;;
    gate)
      run gate 380 python3 -m gate run --config configs/gate/h200-0.8b-padded.yaml \
        --out "$OUT/gate-padded"
      tar czf "$OUT/gate-padded.tgz" -C "$OUT" gate-padded && rm -rf "$OUT/gate-padded" ;;
    profile | planted | budget-served)
      [ "$part" = planted ] && python3 tests/gpu/plant_slowdown.py /tmp/planted --cycles 80000
      run "$part" 570 python3 -m gate run --config "configs/gate/h200-0.8b-${part%-served}.yaml" \
        --out "$OUT/gate-$part"
      tar czf "$OUT/gate-$part.tgz" -C "$OUT" "gate-$part" && rm -rf "$OUT/gate-$part" ;;
    served)
      resume=()
      if [ -f gate-served.tgz ]; then tar xzf gate-served.tgz -C "$OUT" && resume=(--resume); fi
      run served "${SERVED_LIMIT:-560}" python3 -m gate run \
        --config "${SERVED:-results/2026-12-02-h200-0.8b-dense/served.yaml}" \
        --rounds "${ROUNDS:-1}" --out "$OUT/gate-served" "${resume[@]}"
      tar czf "$OUT/gate-served.tgz" -C "$OUT" gate-served && rm -rf "$OUT/gate-served" ;;
    check | check-2b)
      size=0.8b; [ "$part" = check-2b ] && size=2b
      run "$part" 560 python3 -m gate check --config "configs/gate/check-h200-$size.yaml" \
        --arm main=path:.gate/worktrees/main-dc7131b --arm head=. --sweep greedy,concurrency \
        --out "$OUT/check-$size"
      tar czf "$OUT/check-$size.tgz" -C "$OUT" "check-$size" && rm -rf "$OUT/check-$size" ;;
    burst)
      TRITON_CACHE_DIR=$(mktemp -d) run burst 200 python3 -m resident.tools.bench qwen3.5-0.8b --concurrency 1 \
        --burst 64 --json "$OUT/burst.json" ;;
    bench)
      TRITON_CACHE_DIR=$(mktemp -d) run bench 560 python3 -m resident.tools.bench qwen3.5-0.8b --concurrency 1,16,64,256 \
        --burst 64 --json "$OUT/bench.json" ;;
    bench-sampled)
      mkdir -p "$OUT/bench-sampled"
      for draw in "${DRAWS[@]}"; do
        read -r name temperature top_p <<<"$draw"
        run "bench-$name" 300 python3 -m resident.tools.bench qwen3.5-0.8b --concurrency 64 \
          --burst 0 --temperature "$temperature" --top-p "$top_p" \
          --json "$OUT/bench-sampled/$name.json" --cprofile "$OUT/bench-sampled/cprofile-$name"
        mv "$OUT/bench-$name.log" "$OUT/bench-sampled/"
      done
      tar czf "$OUT/bench-sampled.tgz" -C "$OUT" bench-sampled && rm -rf "$OUT/bench-sampled" ;;
    budget)
      for budget in 4096 8192; do
        TRITON_CACHE_DIR=$(mktemp -d) run "budget-$budget" 150 python3 -m resident.tools.bench qwen3.5-0.8b --concurrency "" \
          --burst 64 --set prefill_token_budget=$budget --json "$OUT/budget-$budget.json"
      done ;;
    api-profile)
      run api-profile-c64 400 python3 -m gate.tools.api_profile --model qwen3.5-0.8b \
        --device cuda --concurrency 64 --requests 256 --output-len 256 --format json
      run api-profile-c256 400 python3 -m gate.tools.api_profile --model qwen3.5-0.8b \
        --device cuda --concurrency 256 --requests 1024 --output-len 256 --format json
      run api-profile-c256-x2 400 python3 -m gate.tools.api_profile \
        --model qwen3.5-0.8b --device cuda --concurrency 256 --requests 1024 \
        --output-len 256 --api-processes 2 --format json
      tar czf "$OUT/api-profile.tgz" -C "$OUT" api-profile-c64.log api-profile-c256.log \
        api-profile-c256-x2.log && rm -f "$OUT"/api-profile-c*.log ;;
    host-probe)
      run host-probe 60 python3 tests/gpu/host_probe.py ;;
    hit-phases)
      run hit-phases 200 python3 -m resident.tools.hit_phases qwen3.5-0.8b --device cuda \
        --format json
      run hit-phases-off 200 python3 -m resident.tools.hit_phases qwen3.5-0.8b --device cuda \
        --set prefix_cache=off --format json ;;
    api-spy)
      mkdir -p "$OUT/api-spy"
      for c in 64 256; do
        PATH=$PWD/.whl/bin:$PATH run "api-spy-c$c" 200 python3 -m gate.tools.api_profile \
          --model qwen3.5-0.8b --device cuda --concurrency "$c" --requests $((4 * c)) \
          --output-len 256 --set api_core=0 --py-spy "$OUT/api-spy/c$c.txt" --top 40 \
          ${API_SPY_NATIVE:+--native}
      done
      tar czf "$OUT/api-spy.tgz" -C "$OUT" api-spy && rm -rf "$OUT/api-spy" ;;
    core-spy)
      mkdir -p "$OUT/core-spy"
      for draw in "${DRAWS[@]}"; do
        read -r name temperature top_p <<<"$draw"
        PATH=$PWD/.whl/bin:$PATH run "core-spy-$name" 200 python3 -m gate.tools.api_profile \
          --model qwen3.5-0.8b --device cuda --concurrency 64 --requests 256 --output-len 256 \
          --temperature "$temperature" --top-p "$top_p" --py-spy "$OUT/core-spy/$name.txt" \
          --spy core --native --top 40
        mv "$OUT/core-spy-$name.log" "$OUT/core-spy/"
      done
      tar czf "$OUT/core-spy.tgz" -C "$OUT" core-spy && rm -rf "$OUT/core-spy" ;;
    api-synthetic)
      for c in 64 256; do
        run "api-synthetic-c$c" 120 taskset -c 0-5 python3 -m gate.tools.api_profile \
          --synthetic-decode --concurrency "$c" --requests $((4 * c)) --output-len 256 \
          --set api_core=0 --format json
      done ;;
    load-client)
      run load-client-5x 200 python3 -m gate.tools.load_client_bench --concurrency 256 \
        --clients 4 --server-processes 8 --requests 2048 --output-len 256 --times 5 \
        --format json
      run load-client-unpaced 200 python3 -m gate.tools.load_client_bench \
        --concurrency 256 --clients 4 --server-processes 8 --requests 2048 --output-len 256 \
        --times 0 --format json
      run load-client-cell 200 python3 -m gate.tools.load_client_bench --concurrency 256 \
        --clients 2 --server-processes 8 --requests 2048 --output-len 256 --times 1 \
        --format json
      # one file, not three: a call brings back at most 8
      tar czf "$OUT/load-client.tgz" -C "$OUT" load-client-5x.log load-client-unpaced.log \
        load-client-cell.log && rm -f "$OUT"/load-client-*.log ;;
    parity-fused)
      run parity-fused 200 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
        tests/gpu/test_backends_gpu.py -k fused_small_bucket ;;
    check-fused)
      run check-fused 400 python3 -m gate check --config configs/gate/check-h200-0.8b-fused.yaml \
        --out "$OUT/check-fused"
      tar czf "$OUT/check-fused.tgz" -C "$OUT" check-fused && rm -rf "$OUT/check-fused" ;;
    state-bf16)
      run state-bf16 300 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
        tests/test_kernel_gdn_decode.py tests/test_kernel_gdn_layer_decode.py \
        tests/test_kernel_chunk_states.py tests/gpu/test_backends_gpu.py \
        -k "gpu_0_8b or real_shapes or chunk or bf16_state" ;;
    time-gdn-decode)
      run time-gdn-decode 120 python3 tests/gpu/time_gdn_decode.py ;;
    time-add-norm)
      run time-add-norm 120 python3 tests/gpu/time_add_norm.py ;;
    check-state-bf16)
      run check-state-bf16 "${CHECK_LIMIT:-400}" python3 -m gate check \
        --config configs/gate/check-h200-0.8b-state-bf16-fp32.yaml --out "$OUT/check-state-bf16"
      tar czf "$OUT/check-state-bf16.tgz" -C "$OUT" check-state-bf16 && rm -rf "$OUT/check-state-bf16" ;;
    check-late-launch-fp32)
      run check-late-launch-fp32 "${CHECK_LIMIT:-400}" python3 -m gate check \
        --config configs/gate/check-h200-0.8b-late-launch-fp32.yaml --out "$OUT/$part"
      tar czf "$OUT/$part.tgz" -C "$OUT" "$part" && rm -rf "$OUT/$part" ;;
    check-fused-fp32)
      model=${MODEL:-qwen3.5-0.8b}
      dir=check-fused-fp32-$model
      run check-fused-fp32 "${CHECK_LIMIT:-400}" python3 -m gate check \
        --config configs/gate/check-h200-0.8b-fused-fp32.yaml --model "$model" \
        --name "check-${model#qwen3.5-}-fused-fp32" --out "$OUT/$dir"
      tar czf "$OUT/$dir.tgz" -C "$OUT" "$dir" && rm -rf "$OUT/$dir" ;;
    gate-fused)
      run gate-fused "${GATE_LIMIT:-540}" python3 -m gate run --config configs/gate/h200-0.8b-fused.yaml \
        --out "$OUT/gate-fused"
      tar czf "$OUT/gate-fused.tgz" -C "$OUT" gate-fused && rm -rf "$OUT/gate-fused" ;;
    gemv-sweep)
      for model in ${GEMV_MODELS:-qwen3.5-0.8b}; do
        run "gemv-$model" "${GEMV_LIMIT:-280}" python3 -m resident.tools.bench_gemv --model "$model" \
          --rows "${GEMV_ROWS:-1,4}" --tiles "${GEMV_TILES:-fma}" --json "$OUT/gemv-$model.json"
      done ;;
    gate-addnorm)
      run gate-addnorm "${GATE_LIMIT:-540}" python3 -m gate run \
        --config configs/gate/h200-0.8b-addnorm.yaml --out "$OUT/gate-addnorm"
      tar czf "$OUT/gate-addnorm.tgz" -C "$OUT" gate-addnorm && rm -rf "$OUT/gate-addnorm" ;;
    ttft-prefix)
      read -r -a rates <<< "${TTFT_RATES:-}"
      i=0
      for c in ${TTFT_CONC:-16 64}; do
        rate=${rates[$i]:-0}; i=$((i + 1))
        for cache in on off; do
          run "ttft-$cache-c$c" 300 python3 -m gate.tools.served_ratio --model qwen3.5-0.8b \
            --device cuda --concurrency "$c" --shared-prefix-len 1024 --prompt-len 256 \
            --output-len 256 --requests $((4 * c)) --set "prefix_cache=$cache" \
            --request-rate "$rate" \
            --inductor-cache /tmp/ttft-inductor --logs "/tmp/ttft-$cache-c$c" --format json
          grep -E '"(in_process_tok_s|served_tok_s|ttft_p50_added_ms)"' "$OUT/ttft-$cache-c$c.log"
          python3 -c "$TTFT_ROWS" "$OUT/ttft-$cache-c$c.log"
        done
      done ;;
    prefix-engine)
      run prefix-engine 400 python3 -m pytest -q -s -m gpu -p no:cacheprovider -p no:logging \
        tests/gpu/test_prefix_gpu.py ;;
    check-prefix | check-prefix-2b | check-prefix-fp32 | check-prefix-2b-fp32)
      knobs=()
      case $part in
        check-prefix-2b) config=configs/gate/check-h200-2b-prefix.yaml ;;
        check-prefix-2b-fp32) config=configs/gate/check-h200-2b-prefix.yaml
          knobs=(--set dtype=float32) ;;
        # the command line's --set replaces the file's: float32 again
        check-prefix-fp32) config=configs/gate/check-h200-0.8b-prefix-fp32.yaml
          knobs=(--set dtype=float32) ;;
        *) config=configs/gate/check-h200-0.8b-prefix.yaml ;;
      esac
      # main: this tree with the cache off by name (whatever its default), or the carried
      # worktree of a main from before the cache
      main=(--arm main=. --set main.prefix_cache=off)
      [ -d .gate/worktrees/main-ea55939 ] && main=(--arm main=path:.gate/worktrees/main-ea55939)
      run "$part" "${CHECK_LIMIT:-570}" python3 -m gate check --config "$config" \
        "${main[@]}" --arm head=. "${knobs[@]}" --out "$OUT/$part"
      tar czf "$OUT/$part.tgz" -C "$OUT" "$part" && rm -rf "$OUT/$part" ;;
    gate-event-loop)
      until=(); [ -n "${UNTIL:-}" ] && until=(--until-verdict --max-rounds "$UNTIL")
      run gate-event-loop "${GATE_LIMIT:-450}" python3 -m gate run \
        --config configs/gate/h200-0.8b-event-loop.yaml --interleave --parallel-start \
        "${until[@]}" --out "$OUT/gate-event-loop"
      tar czf "$OUT/gate-event-loop.tgz" -C "$OUT" gate-event-loop \
        && rm -rf "$OUT/gate-event-loop" ;;
    load-client-loops)
      for loop in asyncio uvloop asyncio uvloop; do
        python3 -m gate.tools.load_client_bench --concurrency 256 --clients 2 \
          --server-processes 8 --requests 2048 --output-len 256 --times 1 --loop "$loop" \
          --format json
      done >"$OUT/load-client-loops.log" 2>&1
      echo "== load-client-loops: exit $?"
      grep -E '"(event_loop|client_us_per_token|tok_per_s)"' "$OUT/load-client-loops.log" ;;
    gate-planner)
      # the four planner arms' servers up together: at their default KV pool four 0.8B
      # servers do not fit an 80 GB card (each held 20-25 GiB), so each gets 4 GiB of KV
      run gate-planner "${GATE_LIMIT:-420}" python3 -m gate run \
        --config configs/gate/h200-0.8b-planner-ahead.yaml --interleave --parallel-start \
        --concurrency "${CONC:-1,16,64}" --set kv_cache_gib=4 --rounds "${PLANNER_ROUNDS:-5}" \
        --out "$OUT/gate-planner"
      tar czf "$OUT/gate-planner.tgz" -C "$OUT" gate-planner && rm -rf "$OUT/gate-planner" ;;
    gate-frontend)
      run gate-frontend "${GATE_LIMIT:-400}" python3 -m gate run \
        --config configs/gate/h200-0.8b-frontend.yaml --interleave --parallel-start \
        --out "$OUT/gate-frontend"
      tar czf "$OUT/gate-frontend.tgz" -C "$OUT" gate-frontend && rm -rf "$OUT/gate-frontend" ;;
    gate-prefix | gate-prefix-none | gate-prefix-tail | gate-prefix-long | gate-prefix-open | gate-prefill-buckets | gate-gemv-table | gate-varlen-splits | gate-idle-spin | gate-decode-splits | gate-state-bf16 | gate-targets | gate-gc-young | gate-late-launch | gate-late-launch-prefix | gate-decode-tiles)
      run "$part" "${GATE_LIMIT:-570}" python3 -m gate run \
        --config "configs/gate/h200-0.8b-${part#gate-}.yaml" --out "$OUT/$part"
      tar czf "$OUT/$part.tgz" -C "$OUT" "$part" && rm -rf "$OUT/$part" ;;
    soak)
      run soak "$((${SOAK_S:-600} + 300))" python3 -m gate.tools.soak "${SOAK_ARGS[@]}" ;;
    soak-start)
      mkdir -p /tmp/soak && rm -f /tmp/soak/done
      setsid bash -c 'python3 -m gate.tools.soak "$@" >/tmp/soak/soak.log 2>&1; echo $? >/tmp/soak/done' \
        soak "${SOAK_ARGS[@]}" </dev/null >/dev/null 2>&1 &
      echo "== soak-start: started, pid $!" ;;
    soak-wait)
      waited=0
      while [ ! -f /tmp/soak/done ] && [ "$waited" -lt "${SOAK_WAIT_S:-560}" ]; do
        sleep 5; waited=$((waited + 5))
      done
      echo "== soak-wait: exit $(cat /tmp/soak/done 2>/dev/null || echo 'not done') after $waited s"
      cp /tmp/soak/soak.log "$OUT/soak.log" 2>/dev/null
      server_log=$(grep -o '/tmp/resident-soak-[0-9]*.log' /tmp/soak/soak.log | tail -n 1)
      [ -n "$server_log" ] && tail -c 200000 "$server_log" >"$OUT/soak-server.log"
      grep -A 3 '"check"' "$OUT/soak.log" | grep -E '"(check|ok)"' | paste - - | head -n 20 ;;
    profile-varlen)
      run profile-varlen "${PROFILE_LIMIT:-240}" python3 -m gate run \
        --config configs/gate/h200-0.8b-varlen-profile.yaml --out "$OUT/profile-varlen"
      traces=$OUT/profile-varlen/profiles
      run profile-varlen-gaps 120 python3 -m resident.tools.kernel_gaps "$traces/off-c1.json.gz" \
        "$traces/auto-c1.json.gz" --kind prefill --top 40
      run profile-varlen-top 120 python3 -m resident.tools.kernel_gaps "$traces/off-c1.json.gz" \
        --kind prefill --top 40
      mkdir -p "$OUT/varlen-traces"
      for arm in off auto; do
        python3 tests/gpu/trim_trace.py "$traces/$arm-c1.json.gz" \
          "$OUT/varlen-traces/$arm-c1.json.gz" --first 0 --steps 70
      done
      tar czf "$OUT/profile-varlen-traces.tgz" -C "$OUT" varlen-traces && rm -rf "$OUT/varlen-traces"
      rm -rf "$traces"
      tar czf "$OUT/profile-varlen.tgz" -C "$OUT" profile-varlen && rm -rf "$OUT/profile-varlen" ;;
    sampler)
      run sampler 300 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_sampler_gpu.py \
        ${SAMPLER_K:+-k "$SAMPLER_K"}
      # shellcheck disable=SC2086  # SAMPLERS: a list of words
      run sampler-time 150 python3 tests/gpu/time_draw.py ${SAMPLERS:-} ;;
    time-gdn-layer)
      # shellcheck disable=SC2086  # GDN_LAYER_ARGS: a list of words
      run time-gdn-layer 200 python3 tests/gpu/time_gdn_layer.py ${GDN_LAYER_ARGS:-}
      cat "$OUT/time-gdn-layer.log" ;;
    ring)
      run ring 200 python3 -m pytest -q -p no:cacheprovider tests/test_token_ring.py tests/test_kernel_slot_params.py ;;
    bundle)
      (cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log) && echo "== bundle: logs.tgz" ;;
    gate-sampled)
      run gate-greedy "${GATE_LIMIT:-280}" python3 -m gate run --config configs/gate/h200-0.8b-sampled.yaml \
        --temperature 0 --top-p 1 --rounds "${SAMPLED_ROUNDS:-1}" --name h200-0.8b-greedy --out "$OUT/gate-greedy"
      run gate-sampled "${GATE_LIMIT:-280}" python3 -m gate run --config configs/gate/h200-0.8b-sampled.yaml \
        --rounds "${SAMPLED_ROUNDS:-1}" --out "$OUT/gate-sampled"
      tar czf "$OUT/gate-sampled.tgz" -C "$OUT" gate-greedy gate-sampled \
        && rm -rf "$OUT/gate-greedy" "$OUT/gate-sampled" ;;
    phases-sampled)
      base=()
      # the command line's arms and knobs replace the file's: all three given
      [ -n "${PHASES_BASE:-}" ] && base=(--arm off=. --arm auto=. --arm "base=path:$PHASES_BASE"
        --set off.resident_planning=off --set auto.resident_planning=auto
        --set base.resident_planning=auto)
      run phases-sampled "${PHASES_LIMIT:-400}" python3 -m gate phases \
        --config configs/gate/h200-0.8b-phases-sampled.yaml "${base[@]}" \
        --rounds "${PHASES_ROUNDS:-1}" --out "$OUT/phases-sampled"
      tar czf "$OUT/phases-sampled.tgz" -C "$OUT" phases-sampled && rm -rf "$OUT/phases-sampled" ;;
    check-seeded | check-seeded-triton)
      knobs=(); [ "$part" = check-seeded-triton ] && knobs=(--set sampler=triton)
      run "$part" "${CHECK_LIMIT:-500}" python3 -m gate check \
        --config configs/gate/check-h200-0.8b.yaml --sweep seeded --arm main=. --arm head=. \
        "${knobs[@]}" --out "$OUT/$part"
      tar czf "$OUT/$part.tgz" -C "$OUT" "$part" && rm -rf "$OUT/$part" ;;
    fused-kernels)
      run fused-kernels "${KERNELS_LIMIT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_kernel_gdn_layer_decode.py tests/test_kernel_attention_prologue.py \
        tests/test_kernel_decode_attention.py tests/test_kernel_gemv.py \
        tests/test_kernel_argmax.py tests/test_kernel_add_norm.py ;;
    gemv-medium)
      model=${MODEL:-qwen3.5-0.8b}
      run "gemv-medium-$model" "${GEMV_LIMIT:-240}" python3 -m resident.tools.bench_gemv \
        --model "$model" --rows "${GEMV_ROWS:-32,64}" --tiles "${GEMV_TILES:-dot}" \
        --json "$OUT/gemv-medium-$model.json"
      python3 -c "$MERGE_TABLE" "$OUT/gemv-medium-$model.json" "$OUT/gemv-merged-$model.json" ;;
    gemv-pick)
      # the medium sweep with its row counts picked to the Triton GEMV, stepped against the
      # committed table (results/2026-12-07-h100-pdl-chain), then the confirmed row counts
      model=${MODEL:-qwen3.5-0.8b} rows=${GEMV_ROWS:-32,64,128}
      GEMV_ROWS=$rows bash "$0" gemv-medium
      run pick-gemv-table 60 python3 -m resident.tools.pick_gemv_table \
        "$OUT/gemv-merged-$model.json" --rows "$rows" --out "$OUT/gemv-picked-$model.json"
      GEMV_TABLE=$OUT/gemv-picked-$model.json ARMS="fused table fused2 table2" CONC=$rows \
        bash "$0" arms
      # the arms part names its files by $MODEL as given (0.8b unset)
      run confirm-gemv-pick 60 python3 -m resident.tools.confirm_gemv_table \
        "$OUT/gemv-picked-$model.json" --rule "$OUT/bench-${MODEL:-0.8b}-fused.json" \
        --table "$OUT/bench-${MODEL:-0.8b}-table.json" \
        --out "$OUT/gemv-pick-confirmed-$model.json"
      cat "$OUT/confirm-gemv-pick.log" ;;
    gemv-chain)
      model=${MODEL:-qwen3.5-0.8b}
      run "gemv-chain-fma-$model" "${GEMV_LIMIT:-240}" python3 -m resident.tools.bench_gemv \
        --model "$model" --rows "${GEMV_FMA_ROWS:-1}" --tiles fma --pdl \
        --json "$OUT/gemv-chain-fma-$model.json"
      run "gemv-chain-$model" "${GEMV_LIMIT:-240}" python3 -m resident.tools.bench_gemv \
        --model "$model" --rows "${GEMV_ROWS:-32,128,256}" --tiles dot --pdl \
        --json "$OUT/gemv-chain-$model.json" ;;
    gemv-table)
      model=${MODEL:-qwen3.5-0.8b} rows=${GEMV_ROWS:-1,2,4,8,16}
      chain=(--pdl)
      [ "${GEMV_PDL:-1}" = 0 ] && chain=()
      run "gemv-$model" "${GEMV_LIMIT:-240}" python3 -m resident.tools.bench_gemv --model "$model" \
        --rows "$rows" --tiles "${GEMV_TILES:-fma}" "${chain[@]}" --json "$OUT/gemv-$model.json"
      cache=$(mktemp -d)
      # as in arms: the first arm compiles into an empty Triton cache, 120 s more
      limit=$((${ARM_LIMIT:-170} + 120))
      for arm in rule table; do
        knobs=(--set gemv_table=off)
        [ "$arm" = table ] && knobs=(--set "gemv_table=$OUT/gemv-$model.json")
        TRITON_CACHE_DIR=$cache run "bench-$arm" "$limit" python3 -m resident.tools.bench \
          "$model" --concurrency "$rows" --burst 0 "${knobs[@]}" --json "$OUT/bench-$model-$arm.json"
        limit=${ARM_LIMIT:-170}
      done
      run confirm-gemv-table 60 python3 -m resident.tools.confirm_gemv_table "$OUT/gemv-$model.json" \
        --rule "$OUT/bench-$model-rule.json" --table "$OUT/bench-$model-table.json" \
        --out "$OUT/gemv-table-$model.json"
      cat "$OUT/confirm-gemv-table.log" ;;
    arms)
      # the first arm compiles into an empty cache, 120 s more than the others, unless
      # ARMS_CACHE brings a call before's caches
      cache=$(mktemp -d) limit=$((${ARM_LIMIT:-170} + 120))
      if [ -n "${ARMS_CACHE:-}" ] && tar xzf "$ARMS_CACHE" -C "$cache"; then
        limit=${ARM_LIMIT:-170}
      fi
      for arm in ${ARMS:-fused off nopdl wide}; do
        knobs=() tree=$PWD
        case $arm in
          *@base) tree=${BASE:?arm $arm runs the tree at BASE} ;;
          *@*) tree=$PWD/.gate/worktrees/${arm#*@} ;;
        esac
        if [ ! -d "$tree/resident" ]; then
          echo "== bench-${arm//@/_}: not run: no source tree at $tree (a repeat is fused2@base)"
          continue
        fi
        name=${arm%@*}
        case ${name%[0-9]} in
          off) knobs=(--set fused_decode=off --set pdl=off --set gemv_table=off) ;;
          rule) knobs=(--set gemv_table=off) ;;
          nopdl) knobs=(--set pdl=off) ;;
          pdlonly) knobs=(--set fused_decode=off) ;;
          wide) knobs=(--set decode_gemm=wide) ;;
          full) knobs=(--set fused_decode=full) ;;
          fullnopdl) knobs=(--set fused_decode=full --set pdl=off) ;;
          nosplits) knobs=(--set decode_splits=off) ;;
          torchargmax) knobs=(--set argmax=torch) ;;
          bf16state) knobs=(--set gdn_state_dtype=bfloat16) ;;
          table) knobs=(--set "gemv_table=${GEMV_TABLE:-$OUT/gemv-${MODEL:-qwen3.5-0.8b}.json}") ;;
          fulltable) knobs=(--set fused_decode=full
                            --set "gemv_table=${GEMV_TABLE:-$OUT/gemv-${MODEL:-qwen3.5-0.8b}.json}") ;;
        esac
        # from the arm's tree: python -m puts the working directory first on the path
        # '@' is not a name the device tool brings back
        (cd "$tree" && PYTHONPATH=$tree:/tmp/site TRITON_CACHE_DIR=$cache/triton \
          TORCHINDUCTOR_CACHE_DIR=$cache/inductor run "bench-${arm//@/_}" \
          "$limit" python3 -m resident.tools.bench \
          "${MODEL:-qwen3.5-0.8b}" --concurrency "${CONC:-1,16,64,256}" --burst "${BURST:-0}" \
          "${knobs[@]}" \
          --prompt-len "${PROMPT_LEN:-512}" \
          --json "$OUT/bench-${MODEL:-0.8b}-${arm//@/_}${PROMPT_LEN:+-p$PROMPT_LEN}.json")
        limit=${ARM_LIMIT:-170}
      done
      if [ "${ARMS_CACHE_SAVE:-0}" = 1 ]; then tar czf "$OUT/arms-cache.tgz" -C "$cache" .; fi ;;
    modes)
      for mode in ${MODES:-sequential interleaved}; do
        case $mode in
          interleaved) flags=(--interleave --parallel-start) ;;
          interleaved-serial) flags=(--interleave) ;;
          *) flags=() ;;
        esac
        run "modes-$mode" "${MODES_LIMIT:-200}" python3 -m gate run \
          --config configs/gate/h200-0.8b-c1-modes.yaml "${flags[@]}" --out "$OUT/modes/$mode"
      done
      tar czf "$OUT/modes.tgz" -C "$OUT" modes && rm -rf "$OUT/modes" ;;
    chat)
      run chat 500 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_chat_gpu.py ;;
    served-ratio)
      for c in ${SERVED_RATIO_CONC:-64 256}; do
        case $c in 64) requests=5632 ;; 256) requests=9216 ;; *) requests=$((36 * c)) ;; esac
        run "served-ratio-c$c" 560 python3 -m gate.tools.served_ratio --model qwen3.5-0.8b \
          --device cuda --concurrency "$c" --prompt-len 512 --output-len 256 \
          --requests "$requests" --logs "$OUT/served-ratio-c$c" --format json
        grep -E '"(in_process_tok_s|served_tok_s|ratio|largest_loss)"' "$OUT/served-ratio-c$c.log"
      done ;;
    tp)
      run tp-cpu 200 python3 -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py
      run check-tp 570 python3 -m gate check --config configs/gate/check-h200-9b-tp.yaml \
        --sweep greedy,concurrency --out "$OUT/check-tp"
      tar czf "$OUT/check-tp.tgz" -C "$OUT" check-tp && rm -rf "$OUT/check-tp" ;;
    tp-rows)
      run check-tp-rows 570 python3 -m gate check --config configs/gate/check-h200-9b-tp.yaml \
        --sweep rows --out "$OUT/check-tp-rows"
      tar czf "$OUT/check-tp-rows.tgz" -C "$OUT" check-tp-rows && rm -rf "$OUT/check-tp-rows" ;;
    gate-tp)
      run gate-tp "${GATE_LIMIT:-570}" python3 -m gate run --config configs/gate/h200-9b-tp.yaml \
        --out "$OUT/gate-tp"
      tar czf "$OUT/gate-tp.tgz" -C "$OUT" gate-tp && rm -rf "$OUT/gate-tp" ;;
    *) echo "unknown part $part" ;;
  esac
done
