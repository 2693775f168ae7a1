"""The run's config as types: one `RunConfig` of sections (model, data, recipe, train, checkpoint, infer,
profile, log, hang, plan), each a dataclass whose defaults are the released model's and the reference
recipe's; and `ConfigError`, the one error a config can raise.

Types only: no file is read here (trainer/config/load.py reads YAML and --set) and no value is judged here
(trainer/config/rules.py is the one table of rules). Both import these types; this module imports neither.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file or key and the fix."""


@dataclass
class ModelConfig:
    """The transformer's dimensions; defaults = the released LingBot-VA (robbyant/lingbot-va-base) sizes.

    With `pretrained` set, the dimensions come from that folder's config.json (a conflicting value here
    is an error; trainer/model/weights.py). Names map to config.json as: dim = num_attention_heads x
    attention_head_dim, heads = num_attention_heads, depth = num_layers, latent_channels = in/out_channels,
    patch_size = [patch_t, patch, patch].
    """

    dim: int = 3072  # inner dim = heads x head dim (released: 24 x 128)
    depth: int = 30
    heads: int = 24
    ffn_dim: int = 14336
    text_dim: int = 4096  # T5 (umt5-xxl) embedding width
    freq_dim: int = 256  # sinusoidal timestep features
    cross_attn_norm: bool = True  # affine fp32 LayerNorm before the text cross-attention
    eps: float = 1e-6
    rope_max_seq_len: int = 1024  # kept for config.json round trips (RoPE is computed from positions)
    latent_channels: int = 48  # channels of the video latents (Wan2.2 VAE: 48)
    latent_size: int = 28  # per-view latent grid height the stream's encoder produces
    latent_width: int = 0  # per-view latent grid width; 0 = latent_size (square views)
    patch: int = 2  # spatial patch: tokens per frame = (H / patch) x (W / patch)
    patch_t: int = 1  # temporal patch (released: 1)
    action_dim: int = 30  # padded action width, as in LingBot-VA
    action_used: int = 8  # channels actually used (FurnitureBench: dx dy dz qx qy qz qw grip)
    text_mask: bool = False  # mask padded prompt tokens in cross-attention (reference: attends them)
    pretrained: str = ""  # a released folder (or its transformer/) or a reference checkpoint_step_N/
    attn_block: int = 128  # FlexAttention block size; each token group is padded to a multiple
    attention: str = "auto"  # auto | flex | sdpa  (auto: flex on GPU, sdpa on CPU)
    # per block (trainer/config/perf.py): none | full | op (op-level selective: matmul and attention outputs
    # saved, the rest recomputed) | block:K (every K-th block) | auto (the plan's fastest that fits)
    activation_checkpointing: str = "none"  # true = full, false = none


@dataclass
class RecipeConfig:
    """The reference training recipe (trainer/recipe/draws.py draws it); defaults = upstream 58c2ae5's."""

    num_train_timesteps: int = 1000  # wan_va/train.py: FlowMatchScheduler.set_timesteps(1000, training=True)
    video_shift: float = 5.0  # wan_va/configs/va_*_cfg.py snr_shift
    action_shift: float = 1.0  # wan_va/configs/va_franka_cfg.py action_snr_shift
    loss_weighting: str = "reference"  # reference (scheduler.training_weight) | none
    sigma_per: str = "frame"  # frame: one per frame index per batch (reference) | sample_frame
    noisy_history_prob: float = 0.5  # wan_va/train.py _prepare_input_dict noisy_cond_prob
    noisy_history_min: float = 0.5  # history timestep-id fraction range (min/max_timestep_bd)
    noisy_history_max: float = 1.0
    chunk_min: int = 1  # frames per chunk ~ randint(1, 5): 1..4, redrawn every micro-batch
    chunk_max: int = 4
    window_min: int = 4  # window ~ randint(4, 65): 4..64 (in chunk blocks)
    window_max: int = 64
    text_dropout: float = 0.1  # cfg_prob: prompt replaced by the empty prompt's embedding
    action_clip: float = 1.5  # dataset _action_post_process np.clip(-1.5, 1.5)
    action_rope: str = "reference"  # reference: t = f + (j+1)/(N+1), row = col = -1 | aligned: f + j/N, 0, 0


@dataclass
class DataConfig:
    dataset: str = "furniture_train"
    # a collector data_path (<YYYY-mm-dd-HH:MM:SS>/<same>.pkl), a parent with one folder per furniture, or a
    # flat folder of *.pkl (trainer/data/formats/discovery.py); relative paths are relative to the repo root
    path: str = "data/furniture_train"
    generate_if_missing: bool = True  # write deterministic FurnitureBench-format episodes if absent
    generated_episodes: int = 32
    generated_length: int = 120  # frames per generated episode (10 Hz); LIBERO: actions at most per demo
    generated_tasks: str = ""  # LIBERO's recorded demos' tasks, e.g. "0,8"; "": every task with an expert
    task: str = "one_leg"
    # 1-3 of color_image1 (wrist), color_image2 (front), color_image3 (rear); encoded separately, side by side
    cameras: list[str] = field(default_factory=lambda: ["color_image2"])  # furniture_train: front + wrist
    include_failed: bool = False  # keep episodes with success False / error True (skipped by default)
    prompt: str = (
        "Assemble one leg of the square table: push the tabletop into the corner, pick up a leg, "
        "insert it into the tabletop and screw it in."
    )  # one per task (data.task); embedded with data.text_encoder, plus the empty prompt for dropout
    frames: int = 8  # latent frames per sample (clip length)
    # robot actions per latent frame (N, what the model and the served (C, F, N) use) = the encoder's
    # temporal factor (wan_vae: 4) x data.actions_per_video_frame
    actions_per_frame: int = 2
    # robot actions per video frame: the episode's rows are its actions; its video frames are every
    # actions_per_video_frame-th row (RoboTwin: 4, upstream's frame_stride; FurnitureBench, LIBERO: 1)
    actions_per_video_frame: int = 1
    # how the cameras' latents make one grid (trainer/data/encoding/views.py): side_by_side (every view at
    # latent_size, along the width, in data.cameras order) | tshape (RoboTwin: data.cameras[0] at full size
    # below the others at half size side by side; upstream env_type robotwin_tshape)
    layout: str = "side_by_side"
    # start columns (in the data.action_map order) of 7-wide poses (x y z qx qy qz qw) made relative to the
    # episode's first row: translation minus the first, rotation first^-1 * rotation (upstream's
    # get_relative_pose; RoboTwin: [0, 8]); [] = absolute actions as recorded
    relative_poses: list[int] = field(default_factory=list)
    encoder: str = "patch_mean"  # wan_vae (real, needs vae_path) | patch_mean (weights-free stand-in)
    vae_path: str = ""  # Wan2.2 VAE folder: the released model's vae/ (or the model root holding vae/)
    text_encoder: str = (
        ""  # T5 encoder folder: the released model's text_encoder/ (or its root); "" = stand-in
    )
    tokenizer: str = ""  # tokenizer folder; "" = the tokenizer/ beside text_encoder
    text_length: int = 512  # prompt tokens (reference max_sequence_length)
    latent_cache: bool = True  # precompute latents once, on disk next to the episodes (off: a temporary one)
    cache_dir: str = ""  # put the cache here instead of next to the data (read-only datasets)
    # held-out episodes, never trained on (trainer/data/split.py): a count >= 1, a fraction in (0, 1), 0 = off
    val_episodes: float = 2
    format: str = "auto"  # auto (lerobot when data.path holds meta/info.json) | furniturebench | lerobot
    action_map: list[str] = field(default_factory=lambda: ["action"])  # LeRobot key, key[i], key[i:j] (docs)
    action_slots: list[int] = field(default_factory=list)  # 30-channel slot per action ([]: ACTION_SLOTS)
    # fit (q01/q99 of the training episodes: a new dataset) | fixed (data.norm_q01 / norm_q99 below: the
    # statistics a released checkpoint was trained with, upstream's norm_stat) | quantile | mean_std (the
    # dataset's own meta/ statistics)
    normalize: str = "fit"
    # data.normalize fixed: q01 -> -1 and q99 -> +1 per channel of the model.action_dim-wide action, in slot
    # order (index = the channel data.action_slots maps a value to), as upstream's norm_stat is written
    norm_q01: list[float] = field(default_factory=list)
    norm_q99: list[float] = field(default_factory=list)
    # the released transformer (model.pretrained, a released or exported folder served / evaluated) fed by
    # the weights-free stand-in encoders at full scale: refused unless this is true (announced, recorded)
    allow_stand_in_encoders: bool = False
    upstream_latents: str = "off"  # off | write | read: the reference's <root>/latents/ episode .pth files


@dataclass
class TrainConfig:
    steps: int = 5000
    grad_accum: int = 10
    batch_size: int = 1  # per rank, per micro-step
    lr: float = 1e-5
    warmup_steps: int = 10  # reference: linear warm-up over 10 steps, then constant
    weight_decay: float = 0.1  # reference AdamW weight decay
    grad_clip: float = 2.0  # reference clip_grad_norm_ max norm
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # reference AdamW betas
    adam_eps: float = 1e-8
    seed: int = 0
    grad_sync: str = "last"  # last: reduce-scatter on the last micro-step only | every
    keep_params_gathered: bool = True  # no re-all-gather between micro-steps (FSDP2 reshard_after_* False)
    mixed_precision: str = "auto"  # auto: bf16 params / fp32 reduce on GPU, fp32 on CPU | bf16 | fp32
    log_every: int = 1
    # Speed options (trainer/config/perf.py, docs/performance.md); none changes the maths, a checkpoint
    # resumes across them. compile: compile each block: auto (off until a GPU measures it), true, false
    compile: str = "auto"
    data_path: str = "auto"  # auto (inline until measured on a GPU) | inline | prefetch (a thread)
    optimizer: str = "auto"  # AdamW: auto (fused on CUDA, for_loop on CPU) | fused | foreach | for_loop
    fsdp_prefetch: int = 0  # 0: FSDP2's implicit prefetch | N: explicitly prefetch the next N blocks
    # A NaN/Inf loss or grad_norm (trainer/loop/divergence.py): stop ends the run at that step (no update, no
    # checkpoint from it; exit 1, summary `failed`, reason diverged); skip drops that step's update and
    # stops the same way after more than nonfinite_max_skips such steps in a row.
    nonfinite: str = "stop"  # stop | skip
    nonfinite_max_skips: int = 3
    grad_spike_factor: float = 10.0  # WARNING when grad_norm > this x its running median (0: never)


@dataclass
class CheckpointConfig:
    every: int = 200
    keep: int = 3
    export_safetensors: bool = False  # consolidated weights for evaluation, next to each checkpoint
    export: str = "none"  # reference: also <checkpoint>/transformer/{config.json, *.safetensors} (bf16)
    async_save: bool = False
    skip_space_check: bool = False  # preflight: do not refuse a run dir too small for keep + 1 checkpoints
    validate: bool = True  # held-out losses at every checkpoint and the end (trainer/loop/validate.py)
    best_by: str = "val_action_loss"  # kept out of `keep` pruning, RUN_DIR/checkpoints/best; none = off


@dataclass
class EvalConfig:
    """Closed-loop evaluation in a simulator while training runs (trainer/launcher/simeval.py;
    docs/evaluation.md "During training"): the launcher evaluates every sim_every-th checkpoint apart."""

    sim: str = "none"  # none | libero: bin/evaluate CHECKPOINT --sim libero after each sim_every-th save
    sim_every: int = 200  # steps; with sim set, a multiple of checkpoint.every
    sim_suite: str = "libero_10"  # --suite
    sim_tasks: str = "all"  # --tasks: all, or numbers and ranges (0-2,5)
    sim_episodes: int = 50  # --episodes: per task
    sim_max_steps: int = 800  # --max-steps
    sim_workers: int = 0  # --workers: simulator processes; 0 = bin/evaluate's default (the cores less one)
    sim_device: str = "cpu"  # cpu | cuda:K (a GPU the ranks do not use: bin/train --nproc one less)
    sim_wait_s: float = 1800.0  # at the end of a run, how long the launcher waits for evaluations left
    best_by: str = (
        "none"  # sim: RUN_DIR/checkpoints/best is the highest success rate (not checkpoint.best_by)
    )


@dataclass
class InferConfig:
    """Action inference (trainer/sampling/), as the reference's server runs it; defaults = upstream
    58c2ae5's wan_va/configs/va_franka_cfg.py (one arm + gripper, the setting closest to FurnitureBench)."""

    frames_per_chunk: int = 4  # frame_chunk_size: latent frames generated per chunk
    window: int = 30  # attn_window: the KV cache keeps window // 2 chunks of history
    video_steps: int = 5  # num_inference_steps (video denoising loop)
    action_steps: int = 10  # action_num_inference_steps
    video_shift: float = 5.0  # snr_shift
    action_shift: float = 1.0  # action_snr_shift
    guidance: float = 5.0  # guidance_scale (video); > 1 runs the empty prompt as a second row
    action_guidance: float = 1.0  # action_guidance_scale; > 1 also runs the second row
    video_exec_step: int = -1  # video_exec_step: -1 = every video step then the t = 0 pass; k = first k
    kv_cache: bool = True  # off: the history is recomputed before every pass (same result, for timing)


@dataclass
class ProfileConfig:
    enabled: bool = False  # torch.profiler window, traces per rank under RUN_DIR/profile/
    wait: int = 1
    warmup: int = 1
    active: int = 2
    start_step: int = 1


@dataclass
class LogConfig:
    tensorboard: bool = True
    wandb: bool = False  # offline mode only, and only when wandb is installed


@dataclass
class HangConfig:
    """The launcher's stall detector (trainer/launcher/stall.py) and the backend's collective timeout.

    The limit follows rank 0's phase (progress.json): start-up and the first compiled step, start_s from
    torchrun's start; a step, step_factor x the median step (after warm_up_steps), at least floor_s; a save
    or an evaluation, step_factor x its predicted length (bytes / the write speed seen; its last time), at
    least phase_s. Every limit is at most 0.9 x collective_timeout_s.
    """

    policy: str = "auto"  # auto: requeue under Slurm, fail elsewhere | fail | requeue
    step_factor: float = 10.0
    floor_s: float = 60.0  # a plain step's jitter (GC, a slow read, a write to a network filesystem)
    start_s: float = 1500.0
    phase_s: float = 300.0  # a save's or an evaluation's floor: a network filesystem's stall
    warm_up_steps: int = 1  # steps of each attempt left out of the median (the first one compiles)
    collective_timeout_s: float = 1800.0  # init_process_group(timeout=): gloo's waits, NCCL's watchdog


HANG_POLICIES = ("auto", "fail", "requeue")


@dataclass
class PlanConfig:
    """The preflight's memory check on a GPU node (trainer/plan/, docs/plan.md)."""

    margin: float = 0.10  # the traced peak must stay under (1 - margin) x the GPU's memory
    allow_overfit: bool = False  # run a config predicted not to fit anyway (warns)


@dataclass
class RunConfig:
    name: str = "furniture_train"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    infer: InferConfig = field(default_factory=InferConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    log: LogConfig = field(default_factory=LogConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
