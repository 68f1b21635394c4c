-- logsumexp.lua - test_emu_plan's model for reduce_logsumexp (the online
-- max/sum accumulator, codegen.h CG_RED_LSE) and nn.cross_entropy:
--   rows x dim: logsumexp over few long rows (split over blocks in stages,
--               partial pairs merged), over two trailing axes, and over the
--               leading axis (its own kernel, one thread per column);
--   rows x V:   cross-entropy over a head whose logits have a large offset
--               (exp would overflow without the running max) and a column
--               of -inf (exp(-inf - m) = 0 and no NaN).
local cfg = config{rows = 3, dim = 1500, V = 37}
local R, D, V = cfg.rows, cfg.dim, cfg.V
local x = input("x", {R, D}, "f32")
local y = input("y", {R}, "i32")
local w = param("w", {D}, normal(0.5))
local h = x * w * 3.0
local l1 = h:logsumexp(-1)
local l2 = h:reshape{R, 30, D // 30}:logsumexp({1, 2})
local l3 = h:logsumexp(0)
local wc = param("wc", {D, V}, normal(0.05))
local ninf = select(iota({R, V}, 1):eq(V - 1), const(-math.huge, {R, V}), 0.0)
local logits = matmul(h, wc) + 200.0 + ninf
minimize(mean(l1) + mean(l2) * 0.5 + mean(l3) * 0.1 + nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = R, steps = 1, lr = 1e-2}
