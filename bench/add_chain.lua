-- add_chain.lua - a chain of n adds, for compile-time scaling
-- (bench/compile_scaling.sh): h = x; h = h + w (n times); loss = sum(h * h).
-- The forward chain fuses into one elementwise group of n ops and backward
-- accumulates w's gradient over n uses, so every pass, the fuse pass's
-- merges and codegen's lowering see a group or a chain n ops long.
--
-- Config keys: n 5000 (adds), width 64 (elements of x and w).
local cfg = config{n = 5000, width = 64}
local x = input("x", {cfg.width}, "f32")
local w = param("w", {cfg.width}, normal(0.02))
local h = x
for _ = 1, cfg.n do
  h = h + w
end
minimize(sum(h * h))
