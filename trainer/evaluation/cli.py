"""bin/evaluate: open-loop evaluation of a checkpoint on held-out demonstrations (trainer/evaluation/).

    bin/evaluate TARGET [--episodes NAME,NAME|all] [--config NAME] [--cpu-scale|--full-scale]
                        [--set infer.video_steps=2 ...] [--seed N] [--device auto|cpu|cuda]
                        [--plots-dir DIR] [--json]

TARGET: a RUN_DIR (its newest complete checkpoint), a checkpoint directory, or a reference-layout folder
(the released lingbot-va-base, or a checkpoint's transformer/ export) evaluated with --config's data
(trainer/sampling/load.py). The episodes are the run's held-out split (trainer/data/split.py
`split_episodes(names, data.val_episodes)`); without that module, or with `--episodes all`, every usable
episode is evaluated and a banner says that training episodes are included. The model runs unsharded on
one process (fp32 on CPU, bf16 on a GPU). --set overrides apply to the evaluated config (infer.* chooses
the sampler: steps, shifts, guidance, chunk size, cache).

Per evaluated episode, one PNG of predicted vs recorded actions per channel, chunk starts marked
(trainer/evaluation/plots.py), under --plots-dir (default RUN_DIR/evaluation/<checkpoint>); each is named
in a line `evaluate: plot <episode>: <path>` and in the JSON result's `plots` {episode: path}.

Closed loop in LIBERO's simulator (trainer/evaluation/sim/command.py; docs/evaluation.md):

    bin/evaluate TARGET --sim libero [--suite libero_10|libero_spatial|libero_object|libero_goal]
                        [--tasks 0-2,5|all] [--episodes N per task (50)] [--max-steps 800] [--workers K]
                        [--camera CLIENT_KEY=RUN_CAMERA ...] [--set ...] [--json]
    bin/evaluate --sim libero --expert [--suite ...] [--tasks ...] [--episodes N] [--out DIR] [--json]
                        (the scripted experts of trainer/sim/experts/, no TARGET: the ceiling row)

Exit codes (trainer/attempt.py): 0 done; 2 bad command line, TARGET or config (one line naming the file);
1 the evaluation itself failed (--sim: also some episodes errored, or the simulator env failed).
--json / --json-file: one JSON object, the result (provision/jsonout.py).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path

import click

from provision.jsonout import JsonRequest, outcome, run_click
from trainer.attempt import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def _say(line: str) -> None:
    print(line, file=sys.stderr if JsonRequest.from_argv(sys.argv[1:]).stdout else sys.stdout, flush=True)


def held_out(names: list[str], cfg, requested: str | None) -> tuple[list[str], str]:
    """The episode names to evaluate and the banner that says how they were chosen."""
    if requested is not None and requested != "all":
        wanted = [n.strip() for n in requested.split(",") if n.strip()]
        if not wanted:  # "" or ",": it evaluated nothing and scored a perfect 0.0
            raise click.BadParameter(
                f"--episodes {requested!r} names no episode; name some (a,b), say 'all', or leave --episodes "
                "out for the held-out split"
            )
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise click.BadParameter(f"unknown episode(s) {', '.join(unknown)}; known: {', '.join(names)}")
        twice = sorted({n for n in wanted if wanted.count(n) > 1})
        if twice:  # it was scored once per mention, into one plot and one per-episode entry
            raise click.BadParameter(f"--episodes names {', '.join(twice)} more than once; name each once")
        return wanted, f"evaluate: {len(wanted)} episode(s) named by --episodes"
    if requested == "all":
        return names, f"evaluate: ALL {len(names)} episodes (--episodes all): training episodes included"
    from trainer.data.split import split_episodes

    val = f"{cfg.data.val_episodes:g}"  # a count (1, not the float 1.0) or a share (0.25)
    _, held = split_episodes(names, cfg.data.val_episodes)
    if not held:
        return names, (
            f"evaluate: data.val_episodes={val} holds nothing out: ALL {len(names)} episodes, "
            "training episodes included"
        )
    return list(held), f"evaluate: {len(held)} held-out episode(s) of {len(names)} (data.val_episodes={val})"


def run(target, episodes, config, cpu_scale, sets, seed, device, plots_dir=None) -> dict:
    import torch

    from trainer.config import parse_set, resolve_config
    from trainer.evaluation.openloop import channel_names, evaluate_open_loop
    from trainer.sampling.load import apply_sets, check_trained_stats, load_model, pick_device, resolve_target
    from trainer.sampling.rundata import load_episodes, make_sampler

    dev = pick_device(device)  # before the load: a node without the device says so at once
    resolved = resolve_target(target)  # once: the plots go with the checkpoint evaluated, if best moves
    out = Path(plots_dir) if plots_dir else default_plots_dir(*resolved)
    writable_dir(out, "--plots-dir")  # before the work: it failed after the whole evaluation
    base, sources = resolve_config(config, cpu_scale, parse_set(list(sets)))
    model, cfg, what = load_model(
        target, base, not cpu_scale, lambda line: _say(f"evaluate: {line}"), resolved, sources
    )
    if sets:
        cfg = apply_sets(cfg, list(sets), what, checkpoint=resolved[0] == "checkpoint")
    _say(f"evaluate: {what}")
    model = model.to(dev) if dev.type == "cpu" else model.to(dev, dtype=torch.bfloat16)
    data = load_episodes(cfg)
    said = f"the dataset {cfg.data.path}"
    check_trained_stats(  # the checkpoint loaded above, even if `best` has moved since (a run in training)
        resolved[1], data.normalizer, data.latent_stats, said, lambda line: _say(f"evaluate: {line}")
    )
    chosen, banner = held_out(data.names, cfg, episodes)
    _say(banner)
    sampler = make_sampler(model, cfg, data)
    start = time.perf_counter()
    traces: dict = {}
    result = evaluate_open_loop(
        sampler, data.select(chosen), data.slots, data.normalizer, seed=seed, traces=traces
    )
    result.update(target=what, infer=cfg.to_dict()["infer"], seed=seed, seconds=time.perf_counter() - start)
    failure = scores_failure(result, cfg.infer.frames_per_chunk)
    if failure:  # no score line, no plot (an earlier evaluation's stays): nothing here is a score
        _say(f"evaluate: FAILED: {failure}")
        return {**result, "overall": None, "per_episode": {}, "plots": {}, "error": failure}
    result["plots"] = write_plots(traces, out, channel_names(data.slots))
    o = result["overall"]
    _say(
        f"evaluate: {result['episodes']} episode(s), {o['chunks']} chunks, {o['frames']} predicted frames: "
        f"action MAE {o['action_mae_norm']:.4f} (normalised), latent MSE {o['latent_mse']:.4f}"
    )
    for group, v in o.get("groups", {}).items():
        _say(f"evaluate:   {group:<9} MAE {v['mae_norm']:.4f} normalised, {v['mae_robot']:.5f} robot units")
    for name, path in result["plots"].items():
        _say(f"evaluate: plot {name}: {path}")
    return result


def scores_failure(result: dict, frames_per_chunk: int) -> str:
    """Why an open-loop result is not a score ("" if it is): nothing predicted (it scores 0.0, a perfect
    score: episodes shorter than one chunk), or scores that are not finite (a diverged run)."""
    o = result["overall"]
    if not o["actions"]:
        return (
            f"no action was predicted: {result['episodes']} episode(s), {o['frames_skipped']} latent "
            f"frame(s) left over, none a whole chunk of infer.frames_per_chunk={frames_per_chunk}"
        )
    if not all(math.isfinite(float(o[k])) for k in ("action_mae_norm", "latent_mse")):
        return (
            f"non-finite scores (action MAE {o['action_mae_norm']}, latent MSE {o['latent_mse']}): the "
            "model's predictions are not finite (a diverged run?)"
        )
    return ""


def run_sim(target, episodes, suite, tasks, max_steps, workers, cameras, config, cpu_scale, sets, seed,
            device, out, expert=False) -> tuple[dict, int]:  # fmt: skip
    """--sim libero: trainer/evaluation/sim/command.py; --episodes is the number per task there."""
    from trainer.evaluation.sim.command import Options, run_libero
    from trainer.sim.suites import UsageError

    try:
        n = 50 if episodes is None else int(episodes)
    except ValueError:
        raise UsageError(
            f"--episodes {episodes!r}: with --sim, the number of episodes per task (e.g. 50)"
        ) from None
    resolved = None
    if expert:
        if not out:
            from provision.paths import repo_root

            out = str(repo_root() / "runs" / "experts" / "libero" / suite)
    elif target:
        from trainer.sampling.load import resolve_target

        resolved = resolve_target(target)  # once: the episodes go with the checkpoint loaded, if best moves
        if not out:
            out = str(default_plots_dir(*resolved) / "libero" / suite)
    if out:
        writable_dir(Path(out), "--plots-dir")
    opts = Options(suite, tasks, n, max_steps, workers, tuple(cameras), config, cpu_scale, tuple(sets), seed,
                   device, out or "", expert)  # fmt: skip
    return run_libero(target, opts, lambda line: print(line, file=sys.stderr, flush=True), resolved)


def writable_dir(path: Path, flag: str) -> None:
    """click.BadParameter (exit 2, one line) unless `path` is a folder this user can write, or can be made
    in the nearest folder above it that exists."""
    import os

    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    if here == path and not path.is_dir():
        raise click.BadParameter(f"{flag} {path}: is a file, not a folder; name a folder")
    if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{flag} {path}: {here} is not a folder this user can write; name another")


def default_plots_dir(kind: str, path: Path) -> Path:
    """RUN_DIR/evaluation/<checkpoint> for a checkpoint; for a reference-layout folder, which has no run
    dir, runs/evaluation/<its name> in the repo (gitignored, as bin/train's runs/<config>; an export's
    .../checkpoint_step_N/transformer is named checkpoint_step_N). It was ./evaluation/<folder> in the
    working directory: an untracked folder in the checkout, and every export's plots in one `transformer`."""
    if kind == "checkpoint":
        return path.resolve().parent.parent / "evaluation" / path.resolve().name
    from provision.paths import repo_root

    folder = path.resolve()
    return (
        repo_root()
        / "runs"
        / "evaluation"
        / (folder.parent.name if folder.name == "transformer" else folder.name)
    )


def write_plots(traces: dict, directory: Path, channels) -> dict[str, str]:
    """One PNG per episode (trainer/evaluation/plots.py); {episode: path}."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:  # e.g. the provisioned env, until it carries it
        _say("evaluate: no plots: matplotlib is not installed in this Python (pyproject.toml pins it)")
        return {}
    from trainer.evaluation.plots import plot_episode

    return {name: str(plot_episode(Path(directory), name, trace, channels)) for name, trace in traces.items()}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", required=False)
@click.option("--episodes", default=None, help="comma-separated episode names, or 'all' (default: held out)")
@click.option(
    "--config",
    default=None,
    help="run config for a released folder (furniture_train; --sim libero: libero); a checkpoint has its own",
)
@click.option("--cpu-scale/--full-scale", default=None, help="config scale for a released folder")
@click.option("--set", "sets", multiple=True, help="key=value override, e.g. infer.video_steps=2")
@click.option("--seed", default=0, show_default=True, help="noise seed (per episode and chunk)")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda")
@click.option(
    "--plots-dir",
    "--out",
    "plots_dir",
    default=None,
    help="where the per-episode PNGs go (default: RUN_DIR/evaluation/<checkpoint>, else ./evaluation/<name>)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
@click.option("--json-file", default=None, help="the JSON object written to this file")
@click.option("--sim", type=click.Choice(["libero"]), default=None, help="closed loop in this simulator")
@click.option("--suite", default="libero_10", show_default=True, help="--sim libero: the LIBERO suite")
@click.option("--tasks", default=None, help="--sim: task numbers and ranges, e.g. 0-2,5 (default: all)")
@click.option("--max-steps", default=800, show_default=True, help="--sim: env steps per episode at most")
@click.option("--workers", default=None, type=int, help="--sim: simulator processes (default: cores - 1)")
@click.option("--expert", is_flag=True, help="--sim: the scripted experts instead of a TARGET (no server)")
@click.option(
    "--camera", "cameras", multiple=True, metavar="CLIENT_KEY=RUN_CAMERA", help="--sim: as bin/serve's"
)
def main(target, episodes, config, cpu_scale, sets, seed, device, plots_dir, as_json, json_file, sim, suite,
         tasks, max_steps, workers, cameras, expert) -> None:  # fmt: skip
    """Open-loop evaluation of TARGET on held-out demonstrations (--sim libero: closed loop in LIBERO)."""
    import torch

    from trainer.config import ConfigError
    from trainer.data.formats.furniturebench import DatasetError
    from trainer.sampling.load import TargetError, check_named_config
    from trainer.sim.env import SimEnvError
    from trainer.sim.suites import UsageError

    request = JsonRequest.from_argv(sys.argv[1:])
    request.capture_stdout()
    scale = (not torch.cuda.is_available()) if cpu_scale is None else cpu_scale
    named, config = config, config or ("libero" if sim == "libero" else "furniture_train")
    code = EXIT_OK
    try:
        if expert and not sim:
            raise UsageError("--expert: only with --sim libero (the scripted experts play in the simulator)")
        if not target and not expert:
            raise UsageError("TARGET missing: name a RUN_DIR, a checkpoint or a released folder")
        if target:
            check_named_config(target, named, cpu_scale)  # a checkpoint's config is its own: never ignored
        if sim:
            result, code = run_sim(target, episodes, suite, tasks, max_steps, workers, cameras, config, scale,
                                   sets, seed, device, plots_dir, expert)  # fmt: skip
        else:
            result = run(target, episodes, config, scale, sets, seed, device, plots_dir)
            code = EXIT_FAILED if "error" in result else EXIT_OK
    except SimEnvError as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        request.emit(outcome(EXIT_FAILED, error=str(exc)))
        sys.exit(EXIT_FAILED)
    except (TargetError, ConfigError, DatasetError, click.BadParameter, UsageError) as exc:
        message = exc.format_message() if isinstance(exc, click.BadParameter) else str(exc)
        print(f"evaluate: {message}", file=sys.stderr)
        request.emit(outcome(EXIT_USAGE, error=message))
        sys.exit(EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 - one line on the terminal; the traceback under it for the log
        traceback.print_exc(file=sys.stderr)
        print(f"evaluate: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        request.emit(outcome(EXIT_FAILED, error=f"{type(exc).__name__}: {exc}"))
        sys.exit(EXIT_FAILED)
    if not request.emit(outcome(code, result)):
        code = code or EXIT_FAILED  # the --json-file asked for is missing (said on stderr): never 0
    sys.exit(code)


if __name__ == "__main__":
    run_click(main, "bin/evaluate")
