"""LingBot-VA's transformer (the released `WanTransformer3DModel`) in plain torch, on one packed sequence.

Architecture and parameter names follow the released `transformer/` folder exactly (names in
trainer/model/weights.py RELEASED_LAYOUT), so released and reference-trained weights load strictly (the
layers are in trainer/model/layers.py; this module assembles them and packs a micro-batch):

    patch_embedding_mlp      Linear(C*pt*p*p -> D)        video latent patches -> tokens
    action_embedder          Linear(action_dim -> D)
    condition_embedder       time_embedder.linear_1/2 (sinusoidal freq_dim -> D -> D), time_proj (D -> 6D),
                             text_embedder.linear_1/2 (text_dim -> D -> D, tanh-GELU): video timesteps + text
    condition_embedder_action  the same for action timesteps (its text_embedder exists in the released
                             weights but the reference never calls it: no gradient, kept for strict loading)
    blocks.i                 norm1 (fp32 LayerNorm) -> self-attention attn1 (to_q/k/v, RMSNorm norm_q/k over
                             D, 3-axis RoPE, LingBot mask) -> gated residual; norm2 (affine fp32 LayerNorm)
                             -> text cross-attention attn2 -> residual; norm3 -> ffn.net.0.proj / ffn.net.2
                             (tanh-GELU MLP) -> gated residual. Modulation: scale_shift_table [1, 6, D] +
                             the token's time projection, in fp32.
    norm_out, proj_out, action_proj_out, scale_shift_table [1, 2, D]   output heads (shift, scale)

One micro-batch (trainer/recipe/batch.py) becomes one sequence, samples after each other inside each group:
    noisy video | clean (history) video | noisy actions | clean actions | padding
with per-token timestep modulation, RoPE positions (frame, row, col) for video and (f + (j+1)/(N+1), -1, -1)
for the j-th of N actions of frame f (recipe.action_rope=reference), and one self-attention mask per forward
(trainer/model/masks.py) shared by all blocks. Cross-attention: each token attends its own sample's prompt.

    model = WorldModel(cfg)
    out = model(batch)        # {"loss", "latent_loss", "action_loss"}; loss not divided by grad_accum
    pred = model.predict(batch)   # the raw outputs as the reference's forward_train returns them

Differences from the reference that do not change the maths: time embeddings are computed once per frame
and gathered per token (the reference runs the MLPs on every token); RoPE runs in fp32 (reference fp64).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from trainer.model.attention import BoundAttention, make_backend, resolve_backend
from trainer.model.layers import (
    ConditionEmbedder,
    CrossContext,
    TransformerBlock,
    fp32_layer_norm,
    rope_tables,
)
from trainer.model.masks import (
    SequenceShape,
    TokenLayout,
    lingbot_mask_mod,
    mask_density,
    sequence_shape,
    token_layout,
)
from trainer.recipe.batch import check_micro_batch
from trainer.recipe.draws import loss_weights
from trainer.recipe.losses import action_loss, add_noise, latent_loss, velocity_target


class WorldModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m = cfg.model
        if m.patch_t != 1:
            raise ValueError(f"model.patch_t={m.patch_t}: only 1 (the released value) is supported")
        self.cfg = cfg
        self.dim, self.heads, self.patch = m.dim, m.heads, m.patch
        self.head_dim = m.dim // m.heads
        self.eps = m.eps
        self.apf = cfg.data.actions_per_frame
        patch_dim = m.latent_channels * m.patch_t * m.patch * m.patch
        self.patch_embedding_mlp = nn.Linear(patch_dim, m.dim)
        self.action_embedder = nn.Linear(m.action_dim, m.dim)
        self.condition_embedder = ConditionEmbedder(m.dim, m.freq_dim, m.text_dim)
        self.condition_embedder_action = ConditionEmbedder(m.dim, m.freq_dim, m.text_dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(m.dim, m.ffn_dim, m.heads, m.cross_attn_norm, m.eps) for _ in range(m.depth)
        )
        self.proj_out = nn.Linear(m.dim, patch_dim)
        self.action_proj_out = nn.Linear(m.dim, m.action_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, m.dim) / m.dim**0.5)
        self.apply(self._init_weights)
        # In the released layout but never called by forward (the reference gives it no gradient): frozen,
        # so the optimizer holds state only for what trains and a DCP resume restores exactly that state.
        self.condition_embedder_action.text_embedder.requires_grad_(False)
        self._backend = None
        self._backend_device: str | None = None
        self.attention_name: str | None = None
        self.attention_reason: str | None = None

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    # -- attention backend -------------------------------------------------------------------------
    def set_attention_backend(self, name: str, compiled: bool = True, reason: str = "set explicitly") -> None:
        """Override resolve_backend's choice (tests, benchmarks)."""
        self._backend = make_backend(name, self.cfg.model.attn_block, compiled=compiled)
        self._backend_device = "any"
        self.attention_name, self.attention_reason = name, reason

    def use_attention_backend(self, backend, reason: str) -> None:
        """Use this backend object (build_mask/attend, as trainer/model/attention.py) on every device."""
        self._backend, self._backend_device = backend, "any"
        self.attention_name, self.attention_reason = backend.name, reason

    def _backend_for(self, device: torch.device):
        if self._backend is None or self._backend_device not in ("any", device.type):
            name, reason = resolve_backend(self.cfg, device)
            self._backend = make_backend(name, self.cfg.model.attn_block)
            self._backend_device = device.type
            self.attention_name, self.attention_reason = name, reason
        return self._backend

    # -- sequence pieces ---------------------------------------------------------------------------
    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F, C, H, W) -> (B, F*h*w, C*p*p): frame-major, rows then columns, features (c, p, p)."""
        b, f, c, hh, ww = x.shape
        p = self.patch
        x = x.reshape(b, f, c, hh // p, p, ww // p, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, f * (hh // p) * (ww // p), c * p * p)

    def _unpatchify(self, tokens: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """proj_out's (B, F*h*w, p*p*C) (features (p, p, c), as the reference) -> (B, F, C, H, W)."""
        b, f, c, hh, ww = shape
        p = self.patch
        x = tokens.reshape(b, f, hh // p, ww // p, p, p, c).permute(0, 1, 6, 2, 4, 3, 5)
        return x.reshape(b, f, c, hh, ww)

    @functools.cache  # noqa: B019 - a handful of (batch, grid, pad, device) keys per run
    def _positions(
        self, b: int, f: int, rows: int, cols: int, pad: int, device: torch.device
    ) -> torch.Tensor:
        """(L, 3) float32 RoPE positions of the packed sequence (see the module docstring)."""
        ff, hh, ww = torch.meshgrid(torch.arange(f), torch.arange(rows), torch.arange(cols), indexing="ij")
        video = torch.stack([ff, hh, ww], dim=-1).reshape(-1, 3).float().repeat(b, 1)
        n = self.apf
        frame = torch.arange(f, dtype=torch.float32).repeat_interleave(n)
        j = torch.arange(n, dtype=torch.float32).repeat(f)
        if self.cfg.recipe.action_rope == "reference":
            action = torch.stack([frame + (j + 1) / (n + 1), -torch.ones_like(j), -torch.ones_like(j)], -1)
        else:
            action = torch.stack([frame + j / n, torch.zeros_like(j), torch.zeros_like(j)], -1)
        action = action.repeat(b, 1)
        return torch.cat([video, video, action, action, torch.zeros(pad, 3)]).to(device)

    @staticmethod
    def _pack(parts: list[torch.Tensor], pad: int) -> torch.Tensor:
        """(B, n_i, ...) pieces -> one (1, sum B*n_i + pad, ...) sequence, samples after each other."""
        flat = [p.reshape(1, -1, *p.shape[2:]) for p in parts]
        if pad:
            flat.append(flat[0].new_zeros(1, pad, *flat[0].shape[2:]))
        return torch.cat(flat, dim=1)

    def _cross_context(
        self, text: torch.Tensor, text_mask: torch.Tensor, layout: TokenLayout
    ) -> CrossContext:
        b, n_text = text_mask.shape
        use_mask = self.cfg.model.text_mask
        if b == 1 and not use_mask:  # the reference with one sample: every token attends every prompt token
            return CrossContext(text.reshape(1, -1, self.dim), None, None)
        text_seq = torch.arange(b, device=text.device).repeat_interleave(n_text)
        allowed = layout.seq_ids[:, None] == text_seq[None]
        if use_mask:
            allowed = allowed & text_mask.reshape(1, -1)
        has_key = allowed.any(dim=-1, keepdim=True)
        return CrossContext(text.reshape(1, -1, self.dim), allowed | ~has_key, has_key.float())

    # -- forward -----------------------------------------------------------------------------------
    def predict(self, batch: dict) -> dict[str, torch.Tensor]:
        """Predictions and targets: pred_video/target_video (B, F, C, H, W), pred_action/target_action
        (B, F*N, A), the per-token raw outputs as the reference returns them (video_tokens (B, F*h*w, p*p*C),
        action_tokens (B, F*N, A)), and the action mask."""
        m = self.cfg.model
        check_micro_batch(batch, self.apf, m.action_dim, m.text_dim)
        x, a = batch["latents"], batch["actions"]
        b, f, _, hh, ww = x.shape
        n = self.apf
        if hh % self.patch or ww % self.patch:
            raise ValueError(f"latent grid {hh}x{ww} is not a multiple of model.patch={self.patch}")
        rows, cols = hh // self.patch, ww // self.patch
        amask = batch["action_mask"].to(a.dtype).expand(a.shape)

        # flow matching inputs and targets (noise and levels come with the batch: forward is deterministic)
        noisy_v = add_noise(x, batch["latent_noise"], batch["latent_sigma"])
        clean_v = add_noise(x, batch["history_noise"], batch["history_sigma"])
        noisy_a = (
            add_noise(a, batch["action_noise"], batch["action_sigma"].repeat_interleave(n, dim=1)) * amask
        )
        target_v = velocity_target(x, batch["latent_noise"])
        target_a = velocity_target(a, batch["action_noise"]) * amask

        shape = SequenceShape(frames=f, tokens_per_frame=rows * cols, actions_per_frame=n)
        layout = token_layout(shape, b, batch["frames_per_chunk"], m.attn_block, x.device)
        pad = layout.sections[-1]
        # inputs are mixed in fp32 and cast to the compute dtype (bf16 under FSDP mixed precision, as the
        # reference casts its noisy/clean inputs); sigmas and timesteps stay fp32
        dtype = self.patch_embedding_mlp.weight.dtype
        h = self._pack(
            [
                self.patch_embedding_mlp(self._patchify(noisy_v).to(dtype)),
                self.patch_embedding_mlp(self._patchify(clean_v).to(dtype)),
                self.action_embedder(noisy_a.to(dtype)),
                self.action_embedder((a * amask).to(dtype)),
            ],
            pad,
        )

        # timestep embeddings once per (group, sample, frame), gathered per token
        steps = float(self.cfg.recipe.num_train_timesteps)
        video_t = torch.cat([batch["latent_sigma"], batch["history_sigma"]]).reshape(-1) * steps
        action_t = (
            torch.cat([batch["action_sigma"], torch.zeros_like(batch["action_sigma"])]).reshape(-1) * steps
        )
        temb_v, proj_v = self.condition_embedder(video_t, h.dtype)
        temb_a, proj_a = self.condition_embedder_action(action_t, h.dtype)
        frame_of_token = self._frame_index(b, f, rows * cols, n, pad, x.device)
        temb = torch.cat([temb_v, temb_a, temb_v.new_zeros(1, self.dim)])[frame_of_token][None]
        # fp32 once here (the reference converts it in every block)
        per_frame = torch.cat([proj_v, proj_a, proj_v.new_zeros(1, 6, self.dim)]).float()
        modulation = per_frame[frame_of_token][None]

        rope_cos, rope_sin = rope_tables(self._positions(b, f, rows, cols, pad, x.device), self.head_dim)
        text = self.condition_embedder.text_embedder(batch["text_emb"].to(h.dtype))
        cross = self._cross_context(text, batch["text_mask"], layout)

        # one mask per micro-batch, shared by every block; the window is a tensor so nothing recompiles
        backend = self._backend_for(x.device)
        window = torch.as_tensor(batch["window"], device=x.device)
        attn = BoundAttention(
            backend, backend.build_mask(lingbot_mask_mod(layout, window), layout.length, x.device)
        )
        for block in self.blocks:
            h = block(h, modulation, rope_cos, rope_sin, attn, cross)

        shift, scale = (self.scale_shift_table[None] + temb[:, :, None]).unbind(dim=2)
        h = (fp32_layer_norm(h, self.eps) * (1 + scale) + shift).type_as(h)
        n_video, _, n_action, _, _ = layout.sections
        video_tokens = self.proj_out(h[0, :n_video]).reshape(b, f * rows * cols, -1)
        action_tokens = self.action_proj_out(h[0, 2 * n_video : 2 * n_video + n_action]).reshape(b, f * n, -1)
        return {
            "video_tokens": video_tokens,
            "action_tokens": action_tokens,
            "pred_video": self._unpatchify(video_tokens, x.shape),
            "pred_action": action_tokens,
            "target_video": target_v,
            "target_action": target_a,
            "action_mask": amask,
        }

    @functools.cache  # noqa: B019 - a handful of shapes per run
    def _frame_index(self, b: int, f: int, tpf: int, n: int, pad: int, device: torch.device) -> torch.Tensor:
        """Token -> row of cat([video (noisy, clean) per (sample, frame), action (noisy, clean), zero])."""
        video = torch.arange(2 * b * f).repeat_interleave(tpf)
        action = 2 * b * f + torch.arange(2 * b * f).repeat_interleave(n)
        return torch.cat([video, action, torch.full((pad,), 4 * b * f)]).to(device)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        out = self.predict(batch)
        r = self.cfg.recipe
        w_v = loss_weights(batch["latent_sigma"], r.video_shift, r.num_train_timesteps, r.loss_weighting)
        w_a = loss_weights(batch["action_sigma"], r.action_shift, r.num_train_timesteps, r.loss_weighting)
        lv = latent_loss(out["pred_video"], out["target_video"], w_v)
        la = action_loss(out["pred_action"], out["target_action"], out["action_mask"], self.apf, w_a)
        return {"loss": lv + la, "latent_loss": lv.detach(), "action_loss": la.detach()}

    # -- accounting --------------------------------------------------------------------------------
    def flops_per_token(self) -> float:
        """Training (forward + backward = 3x forward) model FLOPs per real token.

        Matmuls: 2 x weights seen per token (block linears incl. cross-attention q/out; the text keys and
        values are per prompt token, not counted). Attention: 4 x dim per allowed (query, key) pair per
        layer on the LingBot mask at the mean chunk size and window of the recipe, plus 4 x dim x L_text
        for the cross-attention (L_text = 512, the reference's prompt length).
        """
        m = self.cfg.model
        s = sequence_shape(self.cfg)
        block = sum(
            mod.weight.numel()
            for blk in self.blocks
            for name, mod in blk.named_modules()
            if isinstance(mod, nn.Linear) and not name.startswith(("attn2.to_k", "attn2.to_v"))
        )
        video_share = s.video_tokens / (s.video_tokens + s.action_tokens)
        embed = (
            video_share * self.patch_embedding_mlp.weight.numel()
            + (1 - video_share) * self.action_embedder.weight.numel()
        )
        heads = 0.5 * (
            video_share * self.proj_out.weight.numel()
            + (1 - video_share) * self.action_proj_out.weight.numel()
        )
        r = self.cfg.recipe
        chunk, window = (r.chunk_min + r.chunk_max) // 2, (r.window_min + r.window_max) // 2
        keys = mask_density(s, self.cfg.train.batch_size, chunk, window) + 512
        forward = 2 * (block + embed + heads) + 4 * m.dim * keys * m.depth
        return float(3 * forward)
