-- nn.attention's variants (grouped-query heads, sliding window, ALiBi) on
-- params q [B,H,T,D], k and v [B,Hk,T,D], loss = sum(o * w): the graph
-- test_attn_variants runs with the attention pass on and off.
local cfg = config({B = 2, H = 4, Hk = 2, T = 37, D = 32, window = 0, alibi = 0, causal = 1,
                    via = "none"})
local B, H, Hk, T, D = cfg.B, cfg.H, cfg.Hk, cfg.T, cfg.D
local q = param("q", {B, H, T, D}, normal(1.0))
local k = param("k", {B, Hk, T, D}, normal(1.0))
local v = param("v", {B, Hk, T, D}, normal(1.0))
local w = input("w", {B, H, T, D}, "f32")
-- via "mask" / "bias": the causal mask given as nn.attention's mask or
-- bias tensor instead (causal = false; unfused)
local mask, bias
if cfg.via == "mask" then mask = nn.causal_mask(T) end
if cfg.via == "bias" then
  bias = select(nn.causal_mask(T), broadcast_to(const(0.0), {T, T}),
                broadcast_to(const(-1e9), {T, T}))
end
local o = nn.attention(q, k, v, {causal = cfg.causal ~= 0 and cfg.via == "none",
                                 window = cfg.window > 0 and cfg.window or nil,
                                 alibi = cfg.alibi ~= 0, mask = mask, bias = bias})
output("o", o, {train = true})
minimize((o * w):sum())
