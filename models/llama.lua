-- llama.lua - a Llama-style decoder: RMSNorm, rotary position embedding
-- (rotate-half form, no learned positions), SwiGLU MLP, no biases, untied
-- output head. Param names follow the Hugging Face Llama checkpoints without
-- the "model." prefix (embed_tokens.weight, layers.0.self_attn.q_proj.weight,
-- ...), but the layout of every projection is kiln's [din, dout] (y = x W):
-- q/k/v/o_proj [C,C], mlp.gate_proj and up_proj [C,hidden], down_proj
-- [hidden,C], lm_head [C,V]: the transpose of Hugging Face's nn.Linear
-- weights ([dout, din]). embed_tokens [V,C] and the norms' [C] are as in
-- Hugging Face. To load a Hugging Face checkpoint, transpose every 2-D
-- weight except embed_tokens.weight.
--
-- Config keys (change with --set key=value):
--   size "tiny"      preset: "tiny" (the defaults below) or "500B" (a
--                    500B-class dense decoder for `kiln plan`, shapes only:
--                    L=92, H=144, C=18432, SwiGLU hidden 73728, V=128256,
--                    T=8192, batch 1, bf16; docs/plan.md gives its exact
--                    parameter count); other --set keys override the preset
--   L 2, H 4, C 64   layers, heads, channels (C divisible by H; C/H even)
--   hidden 0         SwiGLU hidden size; 0 means Llama's rule:
--                    8C/3 rounded up to a multiple of 32
--   V 256            vocabulary (256: bytes, for data = "text")
--   T 32, batch 8    sequence length and batch (B)
--   rope_base 10000  rotary embedding base
--   eps 1e-5         RMSNorm epsilon
--   tp_marks true    mark Megatron-LM's tensor-parallel split (below); false
--                    leaves every param unmarked (--set shard=auto then
--                    chooses the split: docs/parallel.md)
--   data "text", data_path "tests/data/tiny.txt"; steps 200, lr 1e-3 (`kiln
--                    train --steps N` sets steps; warmup min(100, steps // 10)
--                    and the cosine's end follow it)
--
-- Inputs:  tokens i32[B,T], targets i32[B,T].
-- Outputs: loss (mean cross-entropy per token), logits f32[B,T,V].
local cfg = config({size = "tiny", L = 2, H = 4, C = 64, hidden = 0, V = 256, T = 32,
                    batch = 8, rope_base = 10000.0, eps = 1e-5, data = "text",
                    data_path = "tests/data/tiny.txt", steps = 200, lr = 1e-3, tp_marks = true},
                   {size = {["500B"] = {L = 92, H = 144, C = 18432, hidden = 73728,
                                        V = 128256, T = 8192, batch = 1, data = "tokens",
                                        precision = "bf16", rope_base = 500000.0}}})
local B, T, C, V, L, H = cfg.batch, cfg.T, cfg.C, cfg.V, cfg.L, cfg.H
assert(C % H == 0 and (C // H) % 2 == 0, "C/H must be an even integer")
local hidden = cfg.hidden
if hidden == 0 then hidden = ((8 * C // 3 + 31) // 32) * 32 end
sym{B = B, T = T, C = C, V = V}

local tokens = input("tokens", {"B", "T"}, "i32")
local targets = input("targets", {"B", "T"}, "i32")

local std = 0.02
local proj_std = 0.02 / math.sqrt(2 * L)
-- Tensor parallelism (--tp N) splits what Megatron-LM splits: the
-- embedding and the head by vocabulary, q/k/v and the MLP's gate/up by
-- output columns (heads), o_proj and down_proj by input rows.
local marks = cfg.tp_marks
local embed = nn.Embedding("embed_tokens", "V", "C",
                           {std = std, parallel = marks and "vocab" or nil})

local function attention(p, x)
  local q = param(p .. ".q_proj.weight", {"C", "C"}, normal(std))
  local k = param(p .. ".k_proj.weight", {"C", "C"}, normal(std))
  local v = param(p .. ".v_proj.weight", {"C", "C"}, normal(std))
  local o = param(p .. ".o_proj.weight", {"C", "C"}, normal(proj_std))
  if marks then shard(q, 1); shard(k, 1); shard(v, 1); shard(o, 0) end
  local qh = nn.rope(nn.split_heads(x:matmul(q), H), cfg.rope_base)
  local kh = nn.rope(nn.split_heads(x:matmul(k), H), cfg.rope_base)
  local vh = nn.split_heads(x:matmul(v), H)
  return nn.merge_heads(nn.attention(qh, kh, vh)):matmul(o)
end

local x = embed(tokens)
for i = 0, L - 1 do
  local p = "layers." .. i
  local n1 = nn.RMSNorm(p .. ".input_layernorm", "C", {eps = cfg.eps})
  local n2 = nn.RMSNorm(p .. ".post_attention_layernorm", "C", {eps = cfg.eps})
  local mlp = nn.SwiGLU(p .. ".mlp", "C", hidden, {std = std, proj_std = proj_std,
                                                          parallel = marks})
  x = x + attention(p .. ".self_attn", n1(x))
  x = x + mlp(n2(x))
end
x = nn.RMSNorm("norm", "C", {eps = cfg.eps})(x)
local head = param("lm_head.weight", {"C", "V"}, normal(std))
if marks then shard(head, 1) end
local logits = x:matmul(head)

minimize(nn.cross_entropy(logits, targets))
output("logits", logits)
train{data = cfg.data, data_path = cfg.data_path, batch = B, steps = cfg.steps,
      lr = cfg.lr, min_lr = cfg.lr / 10, warmup = math.min(100, cfg.steps // 10),
      weight_decay = 0.1, grad_clip = 1.0, eval_every = 100,
      precision = cfg.precision}   -- the 500B preset's bf16; nil (f32) otherwise
