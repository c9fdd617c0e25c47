#!/usr/bin/env bash
# The conformance sweep of in-process recovery (docs/RECOVERY.md, "A step is whole or not at
# all"): for each program shape given (tests/python/shapes_train.py SHAPES), a 2-rank run
# without a fault, then one where rank 1 is killed at every point of a step, one after
# another (before the forward, in the backward, right after the optimizer's update, after the
# step), and, with BatchNorm, one where rank 0 is lost. Each faulted run must end bit-identical
# to its fault-free run (parameters and the state after the optimizer on every rank; the
# buffers on every rank, or on rank 0 where they are each rank's own), every fault recovered
# in process, or refused in one line and resumed from the checkpoint.
#   recovery_shapes.sh SHAPE...   (cxx_SHAPE: tests/worker/recovery_shape.cc's SHAPE)
# Environment: DLRUN, SOURCE_DIR, TEST_PYTHON, RECOVERY_SHAPE (the C++ program).
set -euo pipefail
test_name=recovery_shapes
source "$(dirname "$0")/common.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-shapes.XXXXXX")
on_exit '[[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"'
export PYTHON_EXEC=$TEST_PYTHON PYTHONPATH=$SOURCE_DIR/python OMP_NUM_THREADS=1
STEPS=14
EVERY_POINT=2:1:start,5:1:backward,8:1:update,11:1:commit

# --max-restarts 3: a process that went through an in-process recovery now and then dies of
# SIGABRT as it exits ("terminate called without an active exception": PyTorch's Gloo threads at
# the interpreter's end); shapes_train.py calls dlrun_report.done() last, so that is no failure
# once its work is done, and a crash earlier is restarted from the checkpoint; the checks below
# still require every planned fault recovered in process and the run's end exact.
run() {  # run TAG SHAPE KILLS: the run's output in $work/TAG.out, its exit status returned
  mkdir -p "$work/$1"
  local program=("$SOURCE_DIR/tests/python/shapes_train.py" "$2" "$STEPS")
  # cxx_SHAPE: the C++ program (tests/worker/recovery_shape.cc), its checkpoints in argv.
  [[ "$2" == cxx_* ]] && program=("$RECOVERY_SHAPE" "${2#cxx_}" "$STEPS" "$work/$1")
  # --spare-workers off: what is checked is the state, not the replacement's start; a spare
  # that is never promoted (two per run) is ~3 CPU-s of torch imports on a saturated machine.
  CKPT_DIR=$work/$1 KILLS=$3 timeout 300 "$DLRUN" --standalone --nproc-per-node "${NPROC:-2}" \
    --max-restarts "${MAX_RESTARTS:-3}" --spare-workers off ${EXTRA_FLAGS:-} "${program[@]}" \
    >"$work/$1.out" 2>&1
}
# ends TAG: "rank R digest D buffers B" of the last process of each rank, one per line.
ends() { sed -n 's/^\[rank [0-9]*\]: \(rank [0-9]* digest [0-9a-f]* buffers [0-9a-f]*\).*/\1/p' "$work/$1.out" | sort -k2,2 -s | awk '{last[$2]=$0} END {for (r in last) print last[r]}' | sort; }
check() {  # check SHAPE TAG WANT_DONE WANT_REFUSED [EXACT=1]
  local shape=$1 tag=$2 done refused clean got
  done=$(grep -c "in-process recovery done" "$work/$tag.out" || true)
  refused=$(grep -v '^\[rank [0-9]*\]: \[rank' "$work/$tag.out" | grep -cE "(in-process recovery failed \(generation [0-9]+\): |RuntimeError: |recovery_shape: |in-process recovery )refused: |refused the in-process recovery: " || true)
  clean=$(ends "$shape-clean")
  got=$(ends "$tag")
  if [[ "$shape" == *bn_nobcast ]]; then  # each rank's own statistics: rank 0's must hold
    clean=$(echo "$clean" | sed '/^rank [1-9]/ s/ buffers .*//')
    got=$(echo "$got" | sed '/^rank [1-9]/ s/ buffers .*//')
  fi
  [[ -n "$clean" && ( "$got" == "$clean" || ${5:-1} == 0 ) ]] ||
    fail_with_dlrun_lines "$test_name" "$tag ended other than without the fault:
$got
against
$clean" "$work/$tag.out"
  ((done >= $3)) || fail_with_dlrun_lines "$test_name" "$tag: $done in-process recoveries, expected $3 or more" "$work/$tag.out"
  if (($4)); then
    ((refused >= 1)) && grep -q "resumed from step" "$work/$tag.out" ||
      fail_with_dlrun_lines "$test_name" "$tag: no refusal and resume from the checkpoint" "$work/$tag.out"
  else
    ((refused == 0)) || fail_with_dlrun_lines "$test_name" "$tag: refused" "$work/$tag.out"
  fi
  echo "ok: $tag (in process: $done, refused: $refused): $(echo "$got" | tr '\n' ' ')"
}

# resume_then_fault TAG SHAPE: 9 steps (checkpoints of steps 4 and 8), then the same run again:
# it resumes from step 8 and rank 1 is killed in step 9's backward, the first after the resume.
resume_then_fault() {
  STEPS=9 run "$1" "$2" "" ||
    fail_with_dlrun_lines "$test_name" "$1's first 9 steps failed" "$work/$1.out"
  run "$1" "$2" 9:1:backward ||
    fail_with_dlrun_lines "$test_name" "$1 failed" "$work/$1.out"
}

for shape in "$@"; do
  if [[ $shape == hook_one_rank ]]; then  # a hook on rank 1 only: one line at the first step
    rc=0
    run "$shape" "$shape" "" || rc=$?
    ((rc != 0)) || fail_with_dlrun_lines "$test_name" "$shape ran" "$work/$shape.out"
    grep -q "the DDP communication hooks differ across ranks: rank 0 has none; rank 1 has .*fp16_compress_hook (state a process group)" "$work/$shape.out" ||
      fail_with_dlrun_lines "$test_name" "$shape: no line naming the hooks" "$work/$shape.out"
    echo "ok: $shape (refused at the first step)"
    continue
  fi
  if [[ $shape == hang ]]; then  # rank 1 sleeps in step 6: the hang detection names it, it is
    # killed alone and replaced in process (--hang-floor 5: named 5 s after its last step)
    run "$shape-clean" plain "" || fail_with_dlrun_lines "$test_name" "plain without a fault failed" "$work/$shape-clean.out"
    MAX_RESTARTS=0 EXTRA_FLAGS="--hang-floor 5" run "$shape-fault" plain 6:1:sleep ||
      fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
    grep -q "rank 1 hung: .*killing it; the other ranks keep running (in-process recovery)" "$work/$shape-fault.out" ||
      fail_with_dlrun_lines "$test_name" "$shape: rank 1 not named and killed alone" "$work/$shape-fault.out"
    check "$shape" "$shape-fault" 1 0
    continue
  fi
  if [[ $shape == bug ]]; then  # a bug the step done again meets, on the other rank each time:
    # a verdict, no loop
    rc=0
    start_s=$SECONDS
    MAX_RESTARTS=0 run "$shape-fault" "$shape" "" || rc=$?
    ((rc != 0)) || fail_with_dlrun_lines "$test_name" "$shape: the job succeeded" "$work/$shape-fault.out"
    ((SECONDS - start_s < 60)) || fail_with_dlrun_lines "$test_name" "$shape: $((SECONDS - start_s)) s to end" "$work/$shape-fault.out"
    grep -q "failed after step 5 again (rank [01] failed there before and was recovered in process)" "$work/$shape-fault.out" &&
      grep -q "job failed" "$work/$shape-fault.out" ||
      fail_with_dlrun_lines "$test_name" "$shape: no verdict naming the step that repeats" "$work/$shape-fault.out"
    recoveries=$(grep -c "in-process recovery done" "$work/$shape-fault.out" || true)
    ((recoveries <= 2)) || fail_with_dlrun_lines "$test_name" "$shape: $recoveries in-process recoveries of one bug" "$work/$shape-fault.out"
    echo "ok: $shape ended in $((SECONDS - start_s)) s with a verdict ($recoveries in-process recoveries)"
    continue
  fi
  NPROC=2
  # Three ranks: two survivors whose EMAs differ; a sum over three whose order the buckets set.
  [[ $shape == ema_bn || $shape == unused_third ]] && NPROC=3
  run "$shape-clean" "$shape" "" || fail_with_dlrun_lines "$test_name" "$shape without a fault failed" "$work/$shape-clean.out"
  case $shape in
    raw_loader|unused_never|unused_third|ckpt_barrier)  # refused in one line each time, the checkpoint
      # restart in its place not counted: --max-restarts 0 (dlrun's default) is enough
      MAX_RESTARTS=0 run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed with --max-restarts 0" "$work/$shape-fault.out"
      grep -q "refused the in-process recovery: " "$work/$shape-fault.out" &&
        grep -q "restarting from the checkpoint in place of the in-process recovery" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal line at the agent, or no uncounted restart" "$work/$shape-fault.out"
      if [[ $shape == ckpt_barrier ]]; then  # in the steps: in process; in the barrier: refused
        check "$shape" "$shape-fault" 3 1
      else
        check "$shape" "$shape-fault" 0 1
      fi
      ;;
    loader0|loader2)  # every point, and the start of an epoch's first step (the iterator made
      # after the last whole step: its seed drawn from the generators the replacement gets)
      run "$shape-fault" "$shape" 2:1:start,5:1:backward,8:1:start,10:1:commit,12:1:update ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 5 0
      ;;
    exception)  # an error of the program's own in a step: that rank fails at once, and is
      # replaced in process like a killed one
      run "$shape-fault" "$shape" 6:1:raise ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 1 0
      ;;
    micro_steps)  # a fault is seen at the next step that syncs, after a micro-step whose
      # gradients the transfer does not send: refused, the checkpoint (each fault restarts once,
      # not counted: --max-restarts 0)
      MAX_RESTARTS=0 run "$shape-fault" "$shape" 3:1:backward,6:1:start ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      grep -q "refused: step 2 ended with gradients and no optimizer update" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the rule" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 0 1
      ;;
    ema_bn)  # 3 ranks: the EMA's statistics are each rank's own, not compared
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 4 0
      ;;
    update_outside)  # an update outside the step: refused, the checkpoint, never applied twice
      run "$shape-fault" "$shape" 6:1:commit ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      grep -q "refused: optimizer.step() ran outside \`with rec.step()\`" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the rule" "$work/$shape-fault.out"
      # The report: the restart's cause is the kill, and it is one restart after the recovery.
      grep -q "restart 1: rank 1 (local rank 1, pid [0-9]*): SIGKILL, and the in-process recovery after it failed" "$work/$shape-fault.out" &&
        grep -q "after an in-process recovery that did not get past step [0-9]*" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: the report's restart line names another cause" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 0 1
      ;;
    powersgd)  # a hook with state of its own (error feedback): refused, the checkpoint
      # One restart is planned (the refusal). A second one, after PyTorch's SIGABRT at a
      # process' exit (above), resumes from a later checkpoint, and PowerSGD's resume is not
      # exact: that run cannot be compared with the resume by hand, so it runs once more.
      for try in 1 2; do
        rm -rf "${work:?}/$shape-fault"  # a run afresh: the first try's checkpoints would resume
        run "$shape-fault" "$shape" 6:1:commit ||
          fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
        restarts=$(grep -c "info: restart [1-9]" "$work/$shape-fault.out" || true)
        ((restarts > 1)) || break
        echo "note: $shape-fault restarted $restarts times (a SIGABRT at exit?): running it again"
      done
      grep -q "refused: the DDP communication hook .*powerSGD_hook keeps state of its own (PowerSGDState)" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the hook" "$work/$shape-fault.out"
      # Refused and resumed, but not bit-identical to the run without a fault: PowerSGD's own
      # resume from its checkpoint is not exact (its error feedback is keyed by DDP's bucket
      # index, and a fresh DDP's buckets differ from the rebuilt ones until its first step),
      # with or without dlrun. So the resume must be exactly the program's own: the same end as
      # a run of 4 steps (0-3) started again by hand from its checkpoint of step 3.
      check "$shape" "$shape-fault" 0 1 0
      grep -q "resumed from step 3" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: not resumed from step 3's checkpoint" "$work/$shape-fault.out"
      STEPS=4 run "$shape-by-hand" "$shape" "" &&
        run "$shape-by-hand" "$shape" "" && grep -q "resumed from step 3" "$work/$shape-by-hand.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: stopped after step 3 and started again, it failed" "$work/$shape-by-hand.out"
      [[ "$(ends "$shape-fault")" == "$(ends "$shape-by-hand")" ]] ||
        fail_with_dlrun_lines "$test_name" "$shape-fault ended other than the program's own resume from step 3:
$(ends "$shape-fault")
against
$(ends "$shape-by-hand")" "$work/$shape-fault.out"
      echo "ok: $shape-fault ended as the program's own resume from step 3 does"
      ;;
    cxx_direct_tail)  # optimizer.step() itself, then a collective: the kill after the update
      # is refused (no copy to undo it), the others recovered in process
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      grep -q "refused: the parameters changed in step 8 before the peer's loss, not through Recovery::update()" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the rule" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 3 1
      ;;
    cxx_resume)  # a fault in the first step after a checkpoint resume, the trainer not telling
      # the recovery the resumed step (docs/EMBEDDING.md's loop): step 8's state, not step 0's
      resume_then_fault "$shape-fault" "$shape"
      grep -q "rank 0 resumed from step 8" "$work/$shape-fault.out" &&
        grep -q "sent the state of step 8 " "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: not resumed from step 8 and recovered to it" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 1 0
      ;;
    cxx_object)  # the loop written with dlrun::worker::Recoverable: every point of a step and
      # between its two micro-steps (the first under no_sync); a
      # fault in the first step after a checkpoint resume; rank 0 lost (its running statistics
      # with it: refused, resumed from the checkpoint, with the default flags)
      run "$shape-fault" "$shape" "$EVERY_POINT,13:1:micro" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 5 0
      resume_then_fault "$shape-resume" "$shape"
      grep -q "sent the state of step 8 " "$work/$shape-resume.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: not recovered to the resumed step 8" "$work/$shape-resume.out"
      check "$shape" "$shape-resume" 1 0
      MAX_RESTARTS=0 run "$shape-rank0" "$shape" 6:0:backward ||
        fail_with_dlrun_lines "$test_name" "$shape-rank0 failed with --max-restarts 0" "$work/$shape-rank0.out"
      grep -qF "refused: rank 0 was lost, and with it the module's buffers as of step 5" "$work/$shape-rank0.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: rank 0's loss not refused" "$work/$shape-rank0.out"
      check "$shape" "$shape-rank0" 0 1
      ;;
    cxx_dropout_rank)  # the CPU generator seeded per rank by the trainer, then drawn from:
      # every rank's generator is gathered at each commit, so the replacement takes the lost
      # rank's own: in process and exact at every point
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 4 0
      ;;
    cxx_object_rank)  # Recoverable, seeded per rank by the trainer: every point in process; a
      # fault in the first step after a resume (no rank's generator gathered yet in the new
      # processes: refused in one line) resumes each rank with its own from the checkpoint: exact
      run "$shape-fault" "$shape" "$EVERY_POINT,13:1:micro" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 5 0
      MAX_RESTARTS=0 resume_then_fault "$shape-resume" "$shape"
      grep -q "refused: the CPU random generator differs across ranks (seeded per rank?)" "$work/$shape-resume.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: the fault after the resume not refused" "$work/$shape-resume.out"
      check "$shape" "$shape-resume" 0 1
      ;;
    cxx_two_optimizers)  # AdamW and SGD with momentum, both given: every point in process, and
      # a fault in the first step after a resume from the checkpoint (the second's momentum in it)
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 4 0
      resume_then_fault "$shape-resume" "$shape"
      grep -q "rank 0 resumed from step 8" "$work/$shape-resume.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: not resumed from step 8" "$work/$shape-resume.out"
      check "$shape" "$shape-resume" 1 0
      ;;
    cxx_two_optimizers_one)  # the second optimizer not given: its momentum cannot be sent:
      # refused in one line, the restart from the checkpoint, with the default flags
      MAX_RESTARTS=0 run "$shape-fault" "$shape" 6:1:backward ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed with --max-restarts 0" "$work/$shape-fault.out"
      grep -q "refused: parameter 'bn.weight' is in none of the recovery's optimizers" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the parameter" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 0 1 0
      ;;
    cxx_update_rank)  # rank 1 updated twice in step 3: the survivors' update counts differ
      # at the recovery of step 6: refused in one line, the restart from the checkpoint (the
      # replicas differ in the fault-free run too: not compared)
      NPROC=3 MAX_RESTARTS=0 run "$shape-fault" "$shape" 6:2:backward ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed with --max-restarts 0" "$work/$shape-fault.out"
      grep -q "refused: rank(s) 1 applied another number of optimizer updates by step 5 than rank 0 (5)" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no refusal naming the update counts" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 0 1 0
      ;;
    amp_skip)  # the step killed at "update" is one whose update the scaler skips: 3 faults
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 3 0
      ;;
    *)
      run "$shape-fault" "$shape" "$EVERY_POINT" ||
        fail_with_dlrun_lines "$test_name" "$shape-fault failed" "$work/$shape-fault.out"
      check "$shape" "$shape-fault" 4 0
      ;;
  esac
  if [[ "$shape" == bn ]]; then  # rank 0 lost after the step's broadcast of its statistics:
    # the survivors hold them (DDP broadcast them at the step's forward): in process
    run "$shape-rank0" "$shape" 5:0:backward ||
      fail_with_dlrun_lines "$test_name" "$shape-rank0 failed" "$work/$shape-rank0.out"
    check "$shape" "$shape-rank0" 1 0
    # before the step's broadcast (between two steps): nobody holds them: refused, the checkpoint
    run "$shape-rank0-commit" "$shape" 5:0:commit ||
      fail_with_dlrun_lines "$test_name" "$shape-rank0-commit failed" "$work/$shape-rank0-commit.out"
    grep -q "refused: rank 0 was lost, and with it the module's buffers" "$work/$shape-rank0-commit.out" ||
      fail_with_dlrun_lines "$test_name" "$shape: rank 0's loss before the broadcast not refused" "$work/$shape-rank0-commit.out"
    check "$shape" "$shape-rank0-commit" 0 1
  elif [[ "$shape" == bn_nobcast || "$shape" == cxx_bn* ]]; then  # rank 0's own statistics lost: refused
    # (C++: with the default flags, the restart in place of the recovery not counted)
    rank0_restarts=3
    [[ $shape == cxx_* ]] && rank0_restarts=0
    MAX_RESTARTS=$rank0_restarts run "$shape-rank0" "$shape" 5:0:backward ||
      fail_with_dlrun_lines "$test_name" "$shape-rank0 failed" "$work/$shape-rank0.out"
    want="refused: rank 0 was lost, and with it the module's buffers"
    [[ $shape == cxx_bn_nobcast ]] && want="$want as of step 4 ('bn.running_mean'...: its own running statistics, DDP's broadcast_buffers off)"
    [[ $shape == cxx_bn ]] && want="$want as of step 4 ('bn.running_mean'...: running statistics, which DDP broadcasts from rank 0 at each forward)"
    grep -qF "$want" "$work/$shape-rank0.out" ||
      fail_with_dlrun_lines "$test_name" "$shape: rank 0's loss not refused: $want" "$work/$shape-rank0.out"
    if [[ $shape == cxx_bn_nobcast ]]; then  # the replacement of rank 1 said whose statistics it took
      grep -q "rank 1: the running statistics of its model ('bn.running_mean'...: each rank's own, DDP's broadcast_buffers off) were lost with its process: it goes on with rank 0's" "$work/$shape-fault.out" ||
        fail_with_dlrun_lines "$test_name" "$shape: no line for the replacement's statistics" "$work/$shape-fault.out"
    fi
    check "$shape" "$shape-rank0" 0 1
  fi
done
echo "recovery shapes ok: $*"
