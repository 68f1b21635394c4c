-- Attention written by hand, not with nn.attention: key/value heads
-- repeated for grouped-query attention, a sliding window and the causal
-- mask as selects of iota compares written differently from nn.attention,
-- ALiBi's slopes as a power; test_attn_variants checks that the attention
-- pass fuses it (one attention op with kvh, window and alibi) and that the
-- fused step equals this one.
local cfg = config({B = 2, H = 4, Hk = 2, T = 37, D = 16, window = 6, alibi = 1})
local B, H, Hk, T, D, W = cfg.B, cfg.H, cfg.Hk, cfg.T, cfg.D, cfg.window
local q = param("q", {B, H, T, D}, normal(1.0))
local k = param("k", {B, Hk, T, D}, normal(1.0))
local v = param("v", {B, Hk, T, D}, normal(1.0))
local w = input("w", {B, H, T, D}, "f32")
local function rep(x) -- repeat_kv: [B, Hk, T, D] -> [B, H, T, D]
  local g = H // Hk
  return broadcast_to(x:reshape{B, Hk, 1, T, D}, {B, Hk, g, T, D}):reshape{B, H, T, D}
end
local s = matmul(q, rep(k), {tb = true}) / math.sqrt(D)
if cfg.alibi ~= 0 then
  local h = iota({H, 1, 1}, 0, "f32")
  local slopes = pow(broadcast_to(const(2.0), {H, 1, 1}), (h + 1) * (-8 / H))
  s = (iota({T, T}, 1) - iota({T, T}, 0)):cast("f32") * slopes + s
end
local i, j = iota({T, T}, 0), iota({T, T}, 1)
s = select(i:lt(j), -math.huge, s)                 -- drop the future
s = select((j - i):gt(-W), s, -1e4)                -- keep j > i - W
local p = exp(s - stop_gradient(s:max(-1, true)))
local o = matmul(p / p:sum(-1, true), rep(v))
output("o", o, {train = true})
minimize((o * w):sum())
