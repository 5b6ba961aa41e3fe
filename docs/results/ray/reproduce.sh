#!/usr/bin/env bash
# Regenerates docs/results/ray/ on a GPU (bash scripts/gpu/run_all.sh ray): `attnprof bench --ray` through a real local Ray runtime over this machine's GPUs, against
# the same sweep in one process; and, with GRID=h200-bench on a machine of several GPUs, the fleet run over several GPUs.
#
# Needs in .whl/ (carry `.whl`): ray-trim-cp312.tar.xz (made here by `bash scripts/gpu/ray_pack.sh`, 18.5 MB) and the
# kernels wheel (GPU_FACTS.md). Run through run_all.sh, which installs the wheels and packs $OUT:
#   EACH_TIMEOUT=300 bash scripts/gpu/run_all.sh ray                 # any GPU count: ~2.5-3.5 min
#   GRID=h200-bench EACH_TIMEOUT=580 bash scripts/gpu/run_all.sh ray # 2 GPUs: ~6-8 min
# Default, on however many GPUs the machine has (the runtime takes them all):
#   1. ceilings once (the workers read the same cache);
#   2. the small sweep (naive, in-place, SDPA auto, SDPA flash; S = 1k…8k at B·S = 16k, 16 heads, D = 128, bf16
#      causal: 16 cells) in one process, timed, then the same with --ray, timed; compare them; report the Ray run;
#   3. a planted worker death on the GPU (tests/ray_faults.py:die_once, os._exit in the worker's first call):
#      retried, the row is ok, the log shows two worker pids;
#   4. Ctrl-C: SIGINT to a --ray sweep once 2 rows are in, exit 130 expected; --resume finishes it, no duplicate;
#   5. verify's kernel level with --ray (sdpa, sdpa-cudnn, kernel; bf16; default cases): each case names its node.
# GRID=h200-bench: the docs/results/bench grid (naive, in-place, SDPA, SDPA flash, flex; S = 512…16k) with
# CUDA_VISIBLE_DEVICES=0 in one process, then with --ray over every GPU; the wall times and the speed-up.
# Writes under ${OUT:-docs/results/ray}: summary.md (commands, wall times, GPUs, per-node rows, verdicts) and the result folders
# (inproc/, ray/ with report.html/md + PNGs, fault/, interrupt/, verify/, compare/).
# A dry run of this script's plumbing on a CPU box with Ray installed: DEVICE=cpu RAY_PACK=none OUT=/tmp/x bash …
set -u
DEVICE=${DEVICE:-cuda}
pack=${RAY_PACK:-.whl/ray-trim-cp312.tar.xz}
dest="${OUT:-docs/results/ray}"; mkdir -p "$dest"
t0=$(date +%s)
if [ -f "$pack" ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$pack"
elif [ "$pack" != none ]; then
  echo "no $pack: build it here with scripts/gpu/ray_pack.sh and carry .whl" >&2
fi
export PYTHONPATH="/tmp/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export ATTNPROF_CACHE_DIR=/tmp/attnprof-cache ATTNPROF_FAULT_DIR=/tmp/attnprof-faults RAY_USAGE_STATS_ENABLED=0
mkdir -p "$ATTNPROF_FAULT_DIR"
python3 -c "import ray, kernels; print('ray', ray.__version__, ray.__file__)" || { echo "ray does not import"; exit 1; }
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
summary="$dest/summary.md"
{ echo "# attnprof bench --ray on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"
  echo; echo "GPUs: $ngpu. Ray: $(python3 -c 'import ray; print(ray.__version__)') (trimmed, local runtime)."; echo; } \
  > "$summary"
since() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }
log="$dest/ray.log"

if [ "$DEVICE" = cuda ]; then
  python3 -m attnprof ceilings --device cuda --out /tmp/attnprof-ceilings > /dev/null 2>> "$log"
  echo "ceilings exit=$? at $(( $(date +%s) - t0 ))s"
fi

if [ "$DEVICE" = cpu ]; then
  G=(--variants naive,inplace,sdpa --seq 32,64 --batch 1 --heads 2 --head-dim 16 --dtype fp32 --causal --reps 5)
elif [ "${GRID:-small}" = "h200-bench" ]; then
  G=(--variants naive,inplace,sdpa,sdpa-flash,flex --seq 512,1024,2048,4096,8192,16384 --tokens 16384 --heads 16
     --head-dim 128 --dtype bf16 --causal --reps 20)
else
  G=(--variants naive,inplace,sdpa,sdpa-flash --seq 1024,2048,4096,8192 --tokens 16384 --heads 16 --head-dim 128
     --dtype bf16 --causal --reps 20)
fi
limit=${RUN_TIMEOUT:-280}  # each of the two timed runs; a timeout keeps the rows written so far
s=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 -m attnprof bench --device "$DEVICE" "${G[@]}" --out "$dest/inproc" --json \
  > "$dest/inproc.log" 2>&1
rc_one=$?; t_one=$(since "$s")
echo "in-process (1 GPU) exit=$rc_one in ${t_one}s"; tail -1 "$dest/inproc.log" | cut -c1-400
s=$(date +%s.%N)
timeout "$limit" python3 -m attnprof bench --device "$DEVICE" "${G[@]}" --ray --out "$dest/ray" --json > "$dest/ray-run.log" 2>&1
rc_ray=$?; t_ray=$(since "$s")
echo "--ray ($ngpu GPU) exit=$rc_ray in ${t_ray}s"; tail -1 "$dest/ray-run.log" | cut -c1-400
python3 -m attnprof compare "$dest/inproc" "$dest/ray" --out "$dest/compare" >> "$log" 2>&1
echo "compare exit=$?"
python3 -m attnprof report "$dest/ray" >> "$log" 2>&1
echo "report exit=$? at $(( $(date +%s) - t0 ))s"
{ echo "## The sweep in one process, then through Ray"; echo
  echo "Grid: \`${G[*]}\`"; echo
  echo "| run | command | GPUs | wall s | exit |"; echo "| --- | --- | --- | --- | --- |"
  echo "| in-process | \`CUDA_VISIBLE_DEVICES=0 attnprof bench --device $DEVICE <grid> --out inproc\` | 1 | $t_one | $rc_one |"
  echo "| Ray | \`attnprof bench --device $DEVICE <grid> --ray --out ray\` | $ngpu | $t_ray | $rc_ray |"
  echo; python3 -c "print(f'Speed-up of the Ray run: {$t_one / $t_ray:.2f}x')"; echo; } >> "$summary"

if [ "${GRID:-small}" != "h200-bench" ]; then
  # 3. a worker that dies on its first call (a CUDA context inside) is retried by Ray
  one_seq=2048; [ "$DEVICE" = cpu ] && one_seq=32  # "${G[@]:2}": the grid without its --variants
  python3 -m attnprof bench --device "$DEVICE" --variants sdpa,ray_faults:die_once "${G[@]:2}" --seq "$one_seq" \
    --ray --max-retries 1 --out "$dest/fault" --json > "$dest/fault.log" 2>&1
  echo "fault exit=$? (die_once calls, pid seq:)"; cat "$ATTNPROF_FAULT_DIR/die_once.log" | sort | uniq -c
  # 4. Ctrl-C after two rows, then --resume
  set -m  # job control: the background sweep gets SIGINT like a terminal's Ctrl-C (else bash makes it ignore it)
  python3 -m attnprof bench --device "$DEVICE" "${G[@]}" --ray --out "$dest/interrupt" > "$dest/interrupt.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    [ "$(cat "$dest/interrupt/results.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.25
  done
  rows_at_int=$(cat "$dest/interrupt/results.jsonl" 2>/dev/null | wc -l)
  kill -INT "$pid"; wait "$pid"; rc_int=$?
  set +m
  rows_after_int=$(cat "$dest/interrupt/results.jsonl" | wc -l)
  python3 -m attnprof bench --device "$DEVICE" "${G[@]}" --ray --out "$dest/interrupt" --resume --json \
    > "$dest/resume.log" 2>&1
  rc_res=$?
  uniq_keys=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(len(r), len({x['key'] for x in r}))" \
    "$dest/interrupt/results.jsonl")
  echo "interrupt: exit $rc_int with $rows_after_int rows (SIGINT at $rows_at_int); resume exit $rc_res; rows, keys: $uniq_keys"
  # 5. verify's kernel level through Ray
  V=(--variants sdpa,sdpa-cudnn,kernel); [ "$DEVICE" = cpu ] && V=(--variants sdpa,sdpa-cudnn --cases odd-causal,gqa)
  python3 -m attnprof verify --device "$DEVICE" --dtype bf16 "${V[@]}" --seed 20261203 --ray \
    --out "$dest/verify" --json > "$dest/verify.log" 2>&1
  echo "verify --ray exit=$?"; tail -1 "$dest/verify.log" | cut -c1-600
  { echo "## Faults"; echo
    echo "- planted worker death (\`ray_faults:die_once\`, \`--max-retries 1\`): $(tail -1 "$dest/fault.log" | cut -c1-300)"
    echo "- Ctrl-C (SIGINT once $rows_at_int rows were in): exit $rc_int, $rows_after_int rows kept; \`--resume\`: exit $rc_res, rows and distinct keys: $uniq_keys"
    echo "- \`attnprof verify --ray\` (kernel level, bf16): $(tail -1 "$dest/verify.log" | cut -c1-300)"; echo; } >> "$summary"
fi

# Where every row ran: node, GPU ids, GPU name, p50; and the verdicts of compare
python3 - "$dest" >> "$summary" <<'EOF'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
rows = [json.loads(l) for l in (d / "ray" / "results.jsonl").read_text().splitlines() if l.strip()]
print("## Where each Ray row ran\n\n| variant | workload | status | p50 ms | node | pid | GPU ids | GPU |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    n = r["provenance"].get("node", {})
    p50 = (r.get("latency_ms") or {}).get("p50")
    print(f"| {r['variant']} | {r['label']} | {r['status']} | {p50 and round(p50, 4)} | {n.get('host')} "
          f"({(n.get('ray_node_id') or '')[:8]}) | {n.get('pid')} | {','.join(n.get('gpu_ids') or [])} | {n.get('gpu')} |")
c = json.loads((d / "compare" / "compare.json").read_text())
verdicts = {}
for p in c["cells"]:
    verdicts[p["verdict"]] = verdicts.get(p["verdict"], 0) + 1
print(f"\n`attnprof compare inproc ray`: {verdicts} (B/A p50 per cell in compare/compare.json)")
EOF
echo "--- $(( $(date +%s) - t0 ))s"; cat "$summary" | head -60
