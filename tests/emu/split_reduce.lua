-- split_reduce.lua - test_emu_plan's model for split loops (issue 16): row
-- kernels with few rows over long ones and column reductions over many rows
-- run over many blocks in stages, with partials combined in a fixed order
-- (codegen/cuda_print.c). Sizes are just past the split thresholds and are
-- not multiples of the chunks; --set rows=1 dim=1024 n=128 cols=1 is the
-- tiny case (two chunks exactly in rows mode, one live column in its tile).
--   rows x dim: LayerNorm (reduce, reduce, store), softmax (max, sum, store)
--               and full reductions (the loss's means, the gradient-norm
--               clip's sums of squares) over few long rows;
--   rows x n x cols: LayerNorm whose weight and bias gradients are column
--               reductions over rows * n rows.
local cfg = config{rows = 3, dim = 1500, n = 300, cols = 40}
local x = input("x", {cfg.rows, cfg.dim}, "f32")
local z = input("z", {cfg.rows, cfg.n, cfg.cols}, "f32")
local a = nn.LayerNorm("lna", cfg.dim)(x * 4.0)
local s = param("s", {cfg.dim}, normal(0.5))
local p = nn.softmax(a * s)
local b = nn.LayerNorm("lnb", cfg.cols)(z * 3.0)
local v = param("v", {cfg.cols}, normal(0.5))
local loss = mean(tanh(a) * p) * 100.0 + mean(a * a) + mean(tanh(b * v)) + mean(b * b) +
             max(x * s) * 0.01
minimize(loss)
train{data = "blobs", batch = cfg.rows, steps = 1, lr = 1e-2, grad_clip = 1}
