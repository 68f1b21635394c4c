-- A tiny GPT whose attention takes nn.CausalSelfAttention's variants:
-- grouped-query heads (kv_heads), a sliding window and ALiBi (no learned
-- positions then). T = 37: not a multiple of the attention tiles. Trained on
-- the CPU and on the CUDA module over the fakes by tests/cudafake/run.sh
-- (cuda_fake_gpt_variants_*), and by test_attn_variants.
local cfg = config({L = 1, H = 4, kv_heads = 2, window = 9, alibi = 1, C = 32, V = 256,
                    T = 37, batch = 2, data = "text", data_path = "tests/data/tiny.txt",
                    steps = 20, lr = 3e-3, mask = 0, attn_bias = 0})
local B, T, C, V, L, H = cfg.batch, cfg.T, cfg.C, cfg.V, cfg.L, cfg.H
sym{B = B, T = T, C = C, V = V}

local tokens = input("tokens", {"B", "T"}, "i32")
local targets = input("targets", {"B", "T"}, "i32")
-- mask = 1: keys that are spaces masked out ([B,1,1,T] from the tokens);
-- attn_bias = 1: a distance bias -0.05 |i - j| as a [T,T]
-- f32 tensor (both read by the fused kernels at their own shape)
local mask, abias
if cfg.mask ~= 0 then mask = reshape(tokens:ne(32), {B, 1, 1, T}) end
if cfg.attn_bias ~= 0 then
  local d = (iota({T, T}, 1) - iota({T, T}, 0)):cast("f32")
  abias = select(d:lt(0), d, d * -1) * 0.05
end
local wte = nn.Embedding("wte", "V", "C", {std = 0.02})
local x = wte(tokens)
if cfg.alibi == 0 then x = x + nn.Embedding("wpe", "T", "C", {std = 0.01})(iota({"T"}, 0, "i32")) end
for i = 0, L - 1 do
  local p = "h." .. i
  local attn = nn.CausalSelfAttention(p .. ".attn", "C", H,
                                      {kv_heads = cfg.kv_heads,
                                       window = cfg.window > 0 and cfg.window or nil,
                                       alibi = cfg.alibi ~= 0, mask = mask,
                                       attn_bias = abias})
  x = x + attn(nn.LayerNorm(p .. ".ln_1", "C")(x))
  x = x + nn.MLP(p .. ".mlp", "C", 4 * C)(nn.LayerNorm(p .. ".ln_2", "C")(x))
end
x = nn.LayerNorm("ln_f", "C")(x)
minimize(nn.cross_entropy(matmul(x, wte.w, {tb = true}), targets))
train{data = cfg.data, data_path = cfg.data_path, batch = B, steps = cfg.steps, lr = cfg.lr,
      eval_every = 100}
