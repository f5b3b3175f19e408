#!/usr/bin/env bash
# run.sh [tests] [multi] [bench] [offload] [profile] — the GPU checks, run on a bare GPU
# machine from the bundle that tools/gpu/bundle.sh made (this file is
# copied into it). Writes logs, the tests' XML and a summary under $OUT (or
# the bundle's out/). Phases (default: the first four, in one device call of at
# most BUDGET_S seconds, default 570: each phase's time limit is cut to
# what is left, and offload runs only with 120 s or more left; profile,
# not run by default, runs after bench):
#   tests    the GPU tests (kernels, the engine on CUDA with and without
#            CPU offload, the GPT-2 layers, 20-step CPU-vs-GPU parity);
#            the engine's and the parity's again through a one-rank NCCL
#            communicator (ZS_NCCL_ONE_RANK=1: one GPU allows one rank,
#            which otherwise runs its collectives as device copies);
#   multi    several ranks on the one GPU (ZS_DEVICE_COMM=staged: the
#            staged device communicator; docs/cuda.md): the engine's GPU
#            tests at 2 and 4 ranks (bitwise the host backend), at 2 also
#            with device-side chaining (ZS_DEVICE_CHAIN=1), the GPT-2
#            parity at 2 and 4 ranks, and one GPT-2 step's device
#            timeline (ZS_DEVICE_TIMELINE) at 2 ranks, stage 2, with
#            tools/gpu/timeline.py's reductions that overlapped another
#            unit's backward on the device;
#   bench    GPT-2 at 124M size (L=12, C=768, H=12, T=1024; byte
#            vocabulary): tokens/s at ZeRO stage 0 and stage 3, over all
#            8 steps and over the 7 after the first (warm-up); when the
#            bundle holds base/train_sharded (bundle.sh with BASE_BIN:
#            the trainer of another build), the same runs with it too,
#            each stage's baseline run just before ours, and the ratio;
#            then ours with --tf32 (TF32 tensor-core GEMMs), and its ratio
#            to fp32;
#   profile  the same two runs with --kernel-times: GPU time per kernel
#            kind, as a share of the step;
#   offload  CPU offload: the largest model the estimator says fits this
#            machine (GPU and host memory), 3 steps, predicted vs measured.
# Every binary runs under the bundle's own dynamic loader and glibc. The
# exit status (and the summary's last line) counts the failed tests and
# runs.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
B=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$B/out}
mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/summary.txt"; }
# left: seconds of the budget left; limit N: N, or less when less is left
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
limit() { local l; l=$(( $(left) - 10 )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
have_py=0; command -v python3 >/dev/null 2>&1 && have_py=1
phases=${*:-tests multi bench offload}
want() { case " $phases " in *" $1 "*) return 0 ;; esac; return 1; }
log "phases: $phases"
log "date: $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  2>&1 | sed 's/^/gpu: /' | tee -a "$OUT/summary.txt"
log "cpu: $(nproc) cores; $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"

# Open MPI's run time at its Debian paths (MPI singletons need its
# components and help files), unless the machine has its own there.
if [ ! -d /usr/lib/x86_64-linux-gnu/openmpi ] &&
   ! tar -C / -xf "$B/ompi.tar" 2>"$OUT/ompi-unpack.log"; then
  log "cannot unpack Open MPI's run time at / (root needed): $(head -2 "$OUT/ompi-unpack.log")"
fi
# cuBLAS and NCCL from the machine's nvidia-* Python wheels.
pylibs=$(python3 - <<'EOF' 2>/dev/null
import importlib, os
dirs = []
for m in ("nvidia.cublas", "nvidia.nccl", "nvidia.cu13", "nvidia.cuda_runtime"):
    try:
        mod = importlib.import_module(m)
    except Exception:
        continue
    for p in list(getattr(mod, "__path__", [])):
        for sub in ("lib", "lib64"):
            d = os.path.join(p, sub)
            if os.path.isdir(d):
                dirs.append(d)
print(":".join(dirs))
EOF
)
# ... and wherever else the machine keeps libcublas.so.13 and libnccl.so.2
# (a CUDA toolkit, the dynamic linker's cache), if the wheels lack them.
syslibs=""
for lib in libcublas.so.13 libnccl.so.2; do
  in_wheels=$(IFS=:; for d in $pylibs; do [ -e "$d/$lib" ] && echo y; done)
  [ -n "$in_wheels" ] && continue
  found=$( { ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}';
             ls -d /usr/local/cuda*/lib64/"$lib" /usr/local/cuda*/targets/*/lib/"$lib" 2>/dev/null;
             find /usr /opt /root -maxdepth 8 -name "$lib" 2>/dev/null; } | head -1)
  [ -n "$found" ] || continue
  case "$syslibs:" in *":$(dirname "$found"):"*) ;;
    *) syslibs="$syslibs:$(dirname "$found")" ;; esac
done
LIBS="$B/lib:$pylibs$syslibs:/usr/local/nvidia/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
LOADER="$B/lib/ld-linux-x86-64.so.2"
run() { "$LOADER" --library-path "$LIBS" "$@"; }
# The parity test starts the trainer itself: through this wrapper.
cat >"$B/bin/train_sharded.sh" <<EOF
#!/bin/sh
exec "$LOADER" --library-path "$LIBS" "$B/bin/train_sharded" "\$@"
EOF
chmod +x "$B/bin/train_sharded.sh"
if [ -x "$B/base/train_sharded" ]; then
  cat >"$B/bin/train_sharded_base.sh" <<EOF
#!/bin/sh
exec "$LOADER" --library-path "$LIBS" "$B/base/train_sharded" "\$@"
EOF
  chmod +x "$B/bin/train_sharded_base.sh"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_ess_singleton_isolated=1 NVIDIA_TF32_OVERRIDE=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
log "cuBLAS/NCCL from: wheels ${pylibs:-none}; elsewhere ${syslibs:-none}"
[ "$have_py" = 1 ] || log "python3 not found: figures are logged as raw JSON"

# ---- 1. GPU tests --------------------------------------------------------
fails=0
t() {  # t BINARY LIMIT [ARGS]; TLOG names its log and XML (default BINARY)
  local name=$1 tlog=${TLOG:-$1} lim rc
  lim=$(limit "$2")
  shift 2
  timeout "$lim" "$LOADER" --library-path "$LIBS" "$B/bin/$name" "$@" \
    --gtest_output="xml:$OUT/$tlog.xml" >"$OUT/$tlog.log" 2>&1
  rc=$?
  local ok skip
  ok=$(grep -cE '^\[       OK \].*\([0-9]+ ms\)' "$OUT/$tlog.log")
  skip=$(grep -cE '^\[  SKIPPED \].*\([0-9]+ ms\)' "$OUT/$tlog.log")
  if [ $rc = 0 ]; then
    log "test $tlog: passed ($ok ok, $skip skipped)"
  else
    fails=$((fails + 1))
    log "test $tlog: FAILED (exit $rc): $(grep -m3 -E 'Failure|FAILED|rror' "$OUT/$tlog.log" | tr '\n' ' ')"
  fi
}
if want tests; then
  t cuda_test 45
  t gpt2_cuda_layers_test 45
  t engine_cuda_test_bin 90
  TLOG=engine_cuda_test_nccl1 ZS_NCCL_ONE_RANK=1 NCCL_DEBUG=VERSION \
    t engine_cuda_test_bin 90
  log "NCCL in those: $(grep -m1 -o 'NCCL version [^ ]*' "$OUT/engine_cuda_test_nccl1.log" || echo 'no version line (NCCL not loaded?)')"
  t gpt2_parity_test 150 "$B/bin/train_sharded.sh" "$B/data/tinyshakespeare.txt"
  TLOG=gpt2_parity_test_nccl1 ZS_NCCL_ONE_RANK=1 t gpt2_parity_test 150 \
    "$B/bin/train_sharded.sh" "$B/data/tinyshakespeare.txt"
fi
# ---- 1b. Several ranks on the GPU (staged) ---------------------------------
# Open MPI's launcher from the bundle, through its loader; the ranks too
printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" --oversubscribe --bind-to none --mca btl self,vader "$@"\n' \
  "$LOADER" "$LIBS" "$B/bin/orterun" >"$B/bin/mpirun.sh"
chmod +x "$B/bin/mpirun.sh"
tm() {  # tm NP BINARY LIMIT [ARGS]: t under mpirun (no XML: one log for the ranks)
  local np=$1 name=$2 tlog=${TLOG:-$2} lim rc ok
  lim=$(limit "$3")
  shift 3
  timeout "$lim" "$B/bin/mpirun.sh" -np "$np" "$LOADER" --library-path \
    "$LIBS" "$B/bin/$name" "$@" >"$OUT/$tlog.log" 2>&1
  rc=$?
  ok=$(grep -cE '^\[       OK \].*\([0-9]+ ms\)' "$OUT/$tlog.log")
  if [ $rc = 0 ]; then
    log "test $tlog: passed ($ok ok over $np ranks)"
  else
    fails=$((fails + 1))
    log "test $tlog: FAILED (exit $rc): $(grep -m3 -E 'Failure|FAILED|rror' "$OUT/$tlog.log" | tr '\n' ' ')"
  fi
}
if want multi; then
  for np in 2 4; do
    TLOG=engine_cuda_test_staged_np$np ZS_DEVICE_COMM=staged \
      tm "$np" engine_cuda_test_bin 120
  done
  TLOG=engine_cuda_test_staged_chain_np2 ZS_DEVICE_COMM=staged ZS_DEVICE_CHAIN=1 \
    tm 2 engine_cuda_test_bin 120
  for np in 2 4; do
    TLOG=gpt2_parity_test_staged_np$np ZS_DEVICE_COMM=staged \
      ZS_PARITY_LAUNCHER="$B/bin/mpirun.sh -np $np" \
      t gpt2_parity_test 240 "$B/bin/train_sharded.sh" "$B/data/tinyshakespeare.txt"
  done
  # one GPT-2 (124M size) run's device timeline at 2 ranks on the GPU
  rm -f "$OUT"/timeline.rank*.jsonl
  ZS_DEVICE_COMM=staged ZS_DEVICE_TIMELINE="$OUT/timeline" \
    timeout "$(limit 90)" "$B/bin/mpirun.sh" -np 2 "$B/bin/train_sharded.sh" \
    --device cuda --data "$B/data/tinyshakespeare.txt" --eval-every 0 \
    --val-batches 1 --sample-bytes 0 --quiet --layers 12 --channels 768 \
    --heads 12 --seq 1024 --batch 4 --steps 3 --stage 2 \
    >"$OUT/timeline.log" 2>&1
  if [ "$have_py" = 1 ] && ls "$OUT"/timeline.rank*.jsonl >/dev/null 2>&1; then
    python3 "$B/bin/timeline.py" "$OUT/timeline" >"$OUT/timeline.txt" 2>&1
    rc=$?
    sed 's/^/timeline: /' "$OUT/timeline.txt" | tee -a "$OUT/summary.txt"
    [ $rc = 0 ] || { fails=$((fails + 1)); log "timeline: no reduction overlapped a backward (exit $rc)"; }
  else
    fails=$((fails + 1))
    log "timeline: not written (python3: $have_py): $(tail -3 "$OUT/timeline.log" | tr '\n' ' ')"
  fi
fi

# a report's figures: python3 when the machine has it, else the raw JSON
figures() {
  if [ "$have_py" = 1 ]; then python3 -c "$2" "$1" 2>&1; else tr -d '\n' <"$1" | head -c 800; fi
}

# ---- 2. GPT-2 124M-size tokens/s ------------------------------------------
common="--device cuda --data $B/data/tinyshakespeare.txt --eval-every 0 --val-batches 1 --sample-bytes 0 --quiet"
# a report's tokens/s over the steps after the first; its first and last
# loss
losses='import json,sys; s=json.load(open(sys.argv[1]))["steps"]; print("%.4f -> %.4f" % (s[0]["loss"], s[-1]["loss"]))'
steady='import json,sys; r=json.load(open(sys.argv[1])); s=r["steps"]; t=r["config"]["batch"]*r["config"]["seq"]; print("%.0f" % (t*(len(s)-1)/sum(x["seconds"] for x in s[1:])))'
bench_run() {  # bench_run WRAPPER STAGE NAME [FLAGS]: one 8-step run, its report
  ${RUNENV:-} timeout "$(limit 75)" "$B/bin/$1" $common --layers 12 --channels 768 \
    --heads 12 --seq 1024 --batch 8 --steps 8 --stage "$2" ${4:-} \
    --report "$OUT/$3.json" >"$OUT/$3.log" 2>&1
}
for stage in 0 3; do
  want bench || break
  base_tps="" tps=""
  if [ -x "$B/bin/train_sharded_base.sh" ]; then
    if bench_run train_sharded_base.sh $stage bench_base_stage$stage; then
      base_tps=$(python3 -c "$steady" "$OUT/bench_base_stage$stage.json" 2>/dev/null)
      log "bench baseline stage $stage: ${base_tps:-?} tokens/s (steps 2-8)"
    else
      fails=$((fails + 1))
      log "bench baseline stage $stage: FAILED: $(grep -m3 -A1 'train_sharded' "$OUT/bench_base_stage$stage.log" | tr '\n' ' ')"
    fi
  fi
  r="$OUT/bench_stage$stage.json"
  if bench_run train_sharded.sh $stage bench_stage$stage; then
    tps=$(python3 -c "$steady" "$r" 2>/dev/null)
    log "bench gpt2-124M-size stage $stage: $(figures "$r" "import json,sys; print('%.0f' % json.load(open(sys.argv[1]))['tokens_per_s'])") tokens/s (8 steps), ${tps:-?} tokens/s (steps 2-8), loss $(figures "$r" "$losses")"
    [ -n "$base_tps" ] && [ -n "$tps" ] &&
      log "bench stage $stage: ours / baseline = $(python3 -c "print('%.2f' % ($tps / $base_tps))")"
  else
    fails=$((fails + 1))
    log "bench stage $stage: FAILED: $(grep -m3 -A1 'train_sharded' "$OUT/bench_stage$stage.log" | tr '\n' ' ')"
  fi
  # TF32 (the override that keeps the tests in fp32 lifted for this run)
  if RUNENV="env -u NVIDIA_TF32_OVERRIDE" bench_run train_sharded.sh $stage bench_tf32_stage$stage --tf32; then
    tf=$(python3 -c "$steady" "$OUT/bench_tf32_stage$stage.json" 2>/dev/null)
    log "bench stage $stage --tf32: ${tf:-?} tokens/s (steps 2-8), loss $(figures "$OUT/bench_tf32_stage$stage.json" "$losses")$([ -n "$tf" ] && [ -n "${tps:-}" ] && echo "; tf32 / fp32 = $(python3 -c "print('%.2f' % ($tf / $tps))")")"
  else
    fails=$((fails + 1))
    log "bench stage $stage --tf32: FAILED: $(grep -m3 -A1 'train_sharded' "$OUT/bench_tf32_stage$stage.log" | tr '\n' ' ')"
  fi
done

for stage in 0 3; do
  want profile || break
  r="$OUT/profile_stage$stage.json"
  if bench_run train_sharded.sh $stage profile_stage$stage --kernel-times; then
    log "profile stage $stage: $(figures "$r" "
import json, sys; k=json.load(open(sys.argv[1]))['kernel_times']
print('%d steps, %.1f ms/step, kernels %.1f%% of it:' % (k['steps'], 1e3*k['train_s']/k['steps'], 100*k['kernel_s']/k['train_s']),
      '; '.join('%s %.1f%%' % (x['name'], 100*x['share']) for x in sorted(k['kernels'], key=lambda x: -x['seconds'])))")"
  else
    fails=$((fails + 1))
    log "profile stage $stage: FAILED: $(grep -m3 -A1 'train_sharded' "$OUT/profile_stage$stage.log" | tr '\n' ' ')"
  fi
done

# ---- 3. CPU offload: the estimator's largest model, 3 steps ---------------
if ! want offload; then
  log "failed: $fails"
  exit $fails
fi
if [ "$(left)" -lt 120 ]; then
  log "offload: skipped, $(left) s of the ${BUDGET_S} s budget left (run again: run.sh offload)"
  log "failed: $fails"
  exit $fails
fi
if [ "$have_py" = 0 ]; then
  log "offload: skipped, python3 is needed to size the model"
  log "failed: $fails"
  exit $fails
fi
gpu_b=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
gpu_b=$(( ${gpu_b:-0} * 1024 * 1024 ))
if [ "$gpu_b" = 0 ]; then
  log "offload: no GPU (nvidia-smi reports none): skipped"
  log "failed: $fails"
  exit $fails
fi
host_b=$(awk '/MemTotal/ {print $2 * 1024}' /proc/meminfo)
host_b=${HOST_BYTES:-$host_b}
run "$B/bin/zs_estimate" --params 1e9 --ranks 1 --stage 3 --dtype bf16 \
  --reduce-dtype fp32 --offload-optimizer cpu --json >"$OUT/estimate_1e9.json"
fit=$(python3 - "$OUT/estimate_1e9.json" "$gpu_b" "$host_b" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
gpu, host = float(sys.argv[2]), float(sys.argv[3])
dev_pp = e["device_bytes"] / 1e9         # bytes per parameter on the GPU
host_pp = e["per_node_host_bytes"] / 1e9  # and in host memory
# headroom: activations, the fp32 unit copy, staging, CUDA's own
n = min(0.85 * gpu / dev_pp, 0.70 * host / host_pp)
C, H = 4096, 32
block = 12 * C * C + 13 * C
embed = 256 * C + 128 * C + 2 * C  # wte (V=256), wpe (T=128), final norm
L = max(1, int((n - embed) // block))
print(C, H, L, embed, block)
EOF
)
if [ -z "$fit" ]; then
  log "offload: the estimator gave nothing usable: $(head -c 400 "$OUT/estimate_1e9.json")"
  log "failed: $fails"
  exit $fails
fi
set -- $fit
C=$1 H=$2 L=$3 embed=$4 block=$5
log "offload: estimator at 1e9 parameters: $(tr -d '\n ' <"$OUT/estimate_1e9.json")"
# The prediction for such a model on this GPU, with what the count above
# leaves out (its largest unit, a block, sizes the page-locked staging of
# the CPU step, the working set and the reduction buffers): one block
# fewer until it fits the same headroom.
while :; do
  N=$((L * block + embed))
  run "$B/bin/zs_estimate" --params "$N" --largest-layer "$block" --ranks 1 \
    --stage 3 --dtype bf16 --reduce-dtype fp32 --offload-optimizer cpu \
    --device cuda --json >"$OUT/estimate_offload.json"
  read -r dev host < <(python3 -c "import json, sys; e = json.load(open(sys.argv[1])); print(e['device_bytes'], e['per_node_host_bytes'])" "$OUT/estimate_offload.json" 2>/dev/null)
  [ -n "$dev" ] && [ "$L" -gt 1 ] && python3 -c "import sys; d, h, g, m = map(float, sys.argv[1:]); sys.exit(0 if d > 0.85 * g or h > 0.70 * m else 1)" "$dev" "$host" "$gpu_b" "$host_b" || break
  L=$((L - 1))
done
log "offload: GPU $gpu_b B, host $host_b B -> largest model L=$L C=$C ($N parameters): predicted ${dev:-?} B on the GPU, ${host:-?} B in host memory (model states, staging, working set, reduction buffers; activations and cuBLAS's workspace are in the headroom)"
r="$OUT/offload.json"
log "offload: $(left) s left for it"
if timeout "$(limit 540)" "$B/bin/train_sharded.sh" $common --layers "$L" --channels "$C" \
    --heads "$H" --seq 128 --batch 1 --steps 3 --stage 3 --dtype bf16 \
    --offload cpu --report "$r" >"$OUT/offload.log" 2>&1; then
  log "offload 3 steps: $(figures "$r" "
import json, sys; r=json.load(open(sys.argv[1])); k=r['ranks'][0]
print('ok; losses', [round(s['loss'],4) for s in r['steps']], '; measured', json.dumps(k)[:600])")"
else
  fails=$((fails + 1))
  log "offload 3 steps: FAILED: $(grep -m3 -A1 'train_sharded' "$OUT/offload.log" | tr '\n' ' ')"
fi
log "failed: $fails"
exit $fails
