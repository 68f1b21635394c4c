-- nn.attention's additive bias and boolean mask tensors on params q, k, v
-- [B,H,T,D], loss = sum(o * w): test_attn_variants runs it with the
-- attention pass on and off. bshape: the bias's shape, broadcast over the
-- scores [B,H,T,T] (TT, HTT, B1TT, B11T: a key-padding mask, BHTT); kind:
-- bias (an f32 input bw, times 2, where bw < -0.6 replaced by -1e9: a
-- float mask inside it; never on key 0, so that no row is all -1e9, whose
-- softmax f32 cannot tell from a uniform one), mask (u8, kept where bw > -0.5, and always key 0
-- and, where the shape has a query axis, the diagonal: no row keeps
-- nothing; pad > 0: no key from pad on, but key 0), learned (a param of that shape: its gradient keeps the
-- attention unfused).
local cfg = config({B = 2, H = 3, T = 37, D = 16, causal = 1, window = 0, alibi = 0,
                    bshape = "TT", kind = "bias", pad = 0})
local B, H, T, D = cfg.B, cfg.H, cfg.T, cfg.D
local q = param("q", {B, H, T, D}, normal(1.0))
local k = param("k", {B, H, T, D}, normal(1.0))
local v = param("v", {B, H, T, D}, normal(1.0))
local w = input("w", {B, H, T, D}, "f32")
local shapes = {TT = {T, T}, HTT = {H, T, T}, B1TT = {B, 1, T, T}, B11T = {B, 1, 1, T},
                BHTT = {B, H, T, T}}
local bs = shapes[cfg.bshape]
local r = #bs
local opts = {causal = cfg.causal ~= 0, window = cfg.window > 0 and cfg.window or nil,
              alibi = cfg.alibi ~= 0}
if cfg.kind == "learned" then
  opts.bias = param("bias", bs, normal(0.5))
else
  local bw = input("bw", bs, "f32")
  local key0 = iota(bs, r - 1):lt(1):cast("f32") * 10
  if cfg.kind == "mask" then
    local keep = bw + key0
    if bs[r - 1] == T then
      keep = keep + iota(bs, r - 2):eq(iota(bs, r - 1)):cast("f32") * 10
    end
    if cfg.pad > 0 then -- keys from pad on dropped (whole key tiles past it)
      keep = keep - iota(bs, r - 1):ge(cfg.pad):cast("f32") * 100
    end
    opts.mask = keep:gt(-0.5)
  else
    opts.bias = select((bw + key0):lt(-0.6), broadcast_to(const(-1e9), bs), bw * 2)
  end
end
local o = nn.attention(q, k, v, opts)
output("o", o, {train = true})
minimize((o * w):sum())
