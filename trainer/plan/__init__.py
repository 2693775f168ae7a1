"""The plan of a run before it is queued: memory per GPU, FLOPs, communication, step time, ETA, checkpoint.

    from trainer.plan.estimate import make_plan, fit_verdict
    plan = make_plan(cfg, world_size=2, nnodes=1, kinds=[gpu_kind("B200")])   # or target="cpu"
    print(format_plan(plan)); json.dumps(plan.to_json())

Modules: gpus.py (the GPU table, with data-sheet sources), memory.py (the traced peak memory per
category: fake process group + FakeTensorMode + FSDPMemTracker), estimate.py (FLOPs, bytes moved, lower
bounds, ETA, checkpoint size, the fit verdict and the --set changes that would fit), report.py (text),
measure.py (the real-mode measurement that checks the prediction at cpu_scale). `bin/train CONFIG N
--plan [--gpu KIND]` prints it; the launcher's preflight on a GPU node refuses a run predicted not to fit.
"""
