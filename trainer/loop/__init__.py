"""The rank side's training loop, torchtitan's boundary: build() / train_step() / loop() in train.py, the
entry point torchrun starts (`python -m trainer.loop.train`), and what observes it.

    train.py       build (model, optimizer, schedule, data stream, Checkpointer, resume), train_step, loop
    rig.py         the records they pass: Rig, StepOutput, LoopState
    rank.py        process group, stop signals, the collective safe point, a rank's failure record
    observe.py     per-step reporting, progress.json, rank 0's summary at the end
    metrics.py, timing.py, profiling.py   log lines and metrics.jsonl; the step-time breakdown; MFU
    divergence.py  non-finite losses/grad_norm found at the step's all_reduce; grad_norm spikes
    validate.py    held-out losses at every checkpoint

Import the module you need; this package re-exports nothing.
"""
