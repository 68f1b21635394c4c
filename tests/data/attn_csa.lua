-- nn.CausalSelfAttention with its variants (kv_heads, window, alibi, mask) on an
-- input x [B,T,C], loss = sum(y * w): test_attn_variants compares the step
-- with the attention pass on and off (the head layout and attention_dqkv
-- with grouped heads).
local cfg = config({B = 2, T = 37, C = 64, H = 4, kv_heads = 2, window = 0, alibi = 0,
                    mask = 0})
local B, T, C = cfg.B, cfg.T, cfg.C
local x = input("x", {B, T, C}, "f32")
local w = input("w", {B, T, C}, "f32")
-- mask = 1: a key-padding mask [B,1,1,T] (keeps key 0 and where mw > 0.3: the
-- test fills f32 inputs from [0, 1))
local mask
if cfg.mask ~= 0 then
  local key0 = iota({B, 1, 1, T}, 3):lt(1):cast("f32") * 10
  mask = (input("mw", {B, 1, 1, T}, "f32") + key0):gt(0.3)
end
local attn = nn.CausalSelfAttention("attn", C, cfg.H,
                                    {kv_heads = cfg.kv_heads,
                                     window = cfg.window > 0 and cfg.window or nil,
                                     alibi = cfg.alibi ~= 0, mask = mask, std = 0.3,
                                     proj_std = 0.3})
minimize((attn(x) * w):sum())
