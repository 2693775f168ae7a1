"""The launcher side of bin/train: runs in the tool env (.venv) or any env with this checkout, owns the
processes and the signals, never imports torch's training stack at module level.

    cli.py            the command line (argparse) and its exit code 2
    envchoice.py      which env the ranks run in (--env/--prefix, $CONDA_PREFIX, default, tool env)
    preflight.py      checks before any rank starts: run dir, bin/envcheck --fast (a recorded pass on the
                      same node + boot + env reuses its compile checks), disk space
    rendezvous.py     torchrun's static rendezvous from flags, Slurm's variables, or one node
    compile_cache.py  persistent Triton/Inductor caches per env + GPU kind: node-local copy, atomic write-back
    supervise.py      torchrun as a child, stop signals -> the attempt's stop request, scontrol requeue
    verdict.py        the outcome from what the ranks recorded (not from torchrun's exit status alone)
    sbatch.py         `bin/train --sbatch`: the batch script for the same run
    summaries.py      the summary.json the launcher writes: preflight failure, running, final verdict
    resolved.py       what preflight resolved (Launch) and what an early stop needs (Known)
    errors.py, console.py  PreflightError/StopBeforeStart; say()
    main.py           the order of the above and the messages

The rank side (provisioned env, model, loop) is trainer/loop/train.py and the modules it imports; the two
sides talk only through RUN_DIR/attempts/<id>/ (trainer/attempt.py).
"""
