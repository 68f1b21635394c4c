-- gpt.lua - a GPT-2 style decoder: learned token and position embeddings,
-- pre-LayerNorm blocks (causal self-attention, GELU MLP), a final LayerNorm,
-- and an output head tied to the token embedding. Param names follow the
-- GPT-2 checkpoints (wte.weight, h.0.attn.c_attn.weight [C,3C], ...).
--
-- Config keys (change with --set key=value):
--   size     "tiny"   preset: "tiny" (the defaults below) or "124M" (GPT-2
--                    small: L=12, H=12, C=768, V=50257, T=1024, data "tokens",
--                    lr 6e-4); other --set keys override the preset's values
--   L 2, H 2, C 32   layers, heads, channels (C divisible by H)
--   V 256            vocabulary (256: bytes, for data = "text")
--   vocab_pad 1      pad the vocabulary (wte rows, head columns) to a multiple
--                    (124M: 64, 50257 -> 50304); the padding is masked out of
--                    the loss and cut from the logits output, tokens never
--                    index it
--   T 32, batch 4    sequence length and batch (B)
--   dropout 0        dropout probability (attention weights, residual branches)
--   tp_marks true    mark Megatron-LM's tensor-parallel split (below); false
--                    leaves every param unmarked (--set shard=auto then
--                    chooses the split: docs/parallel.md)
--   data "text", data_path "tests/data/tiny.txt"
--   steps 2000, lr 3e-3  training length and peak learning rate (`kiln train
--                    --steps N` sets steps; warmup min(100, steps // 10) and
--                    the cosine's end follow it)
--
-- Inputs:  tokens i32[B,T], targets i32[B,T] (tokens shifted by one).
-- Outputs: loss (mean cross-entropy per token); evaluation also logits
-- f32[B,T,V] (the real vocabulary).
local cfg = config({size = "tiny", L = 2, H = 2, C = 32, V = 256, T = 32, batch = 4,
                   dropout = 0.0, data = "text", data_path = "tests/data/tiny.txt",
                   steps = 2000, lr = 3e-3, vocab_pad = 1, tp_marks = true},
                  {size = {["124M"] = {L = 12, H = 12, C = 768, V = 50257, T = 1024,
                                       data = "tokens", lr = 6e-4, vocab_pad = 64}}})
assert(cfg.C % cfg.H == 0, "C must be divisible by H")

local B, T, C, V, L, H = cfg.batch, cfg.T, cfg.C, cfg.V, cfg.L, cfg.H
sym{B = B, T = T, C = C, V = V}   -- shapes written with these names print them

local tokens = input("tokens", {"B", "T"}, "i32")
local targets = input("targets", {"B", "T"}, "i32")

-- Tensor parallelism (--tp N) splits what Megatron-LM splits: wte (and so
-- the tied head) by vocabulary, attention by heads, the MLP's c_fc by
-- columns and every c_proj by rows.
local wte = nn.Embedding("wte", "V", "C", {std = 0.02, pad = cfg.vocab_pad,
                                          parallel = cfg.tp_marks and "vocab" or nil})
local wpe = nn.Embedding("wpe", "T", "C", {std = 0.01})
local proj_std = 0.02 / math.sqrt(2 * L)   -- GPT-2's scaled init of residual projections

local x = wte(tokens) + wpe(iota({"T"}, 0, "i32"))
x = nn.dropout(x, cfg.dropout)
for i = 0, L - 1 do
  local p = "h." .. i
  local ln1 = nn.LayerNorm(p .. ".ln_1", "C")
  local attn = nn.CausalSelfAttention(p .. ".attn", "C", H,
                                      {proj_std = proj_std, dropout = cfg.dropout,
                                       parallel = cfg.tp_marks})
  local ln2 = nn.LayerNorm(p .. ".ln_2", "C")
  local mlp = nn.MLP(p .. ".mlp", "C", 4 * C, {proj_std = proj_std, dropout = cfg.dropout,
                                               parallel = cfg.tp_marks})
  x = x + attn(ln1(x))
  x = x + mlp(ln2(x))
end
x = nn.LayerNorm("ln_f", "C")(x)
local logits = matmul(x, wte.w, {tb = true})   -- tied head: [B,T,C] x [Vp,C]^T

minimize(nn.cross_entropy(logits, targets, nil, {classes = V}))
output("logits", wte.rows > V and logits:slice(-1, 0, V) or logits)
train{data = cfg.data, data_path = cfg.data_path, batch = B, steps = cfg.steps,
      lr = cfg.lr, min_lr = cfg.lr / 10, warmup = math.min(100, cfg.steps // 10),
      weight_decay = 0.1, grad_clip = 1.0, eval_every = 100}
