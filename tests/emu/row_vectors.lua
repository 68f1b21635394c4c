-- row_vectors.lua - test_emu_plan's model for 16-byte accesses in row loops
-- (issue 16, codegen/cuda_row.c): LayerNorm, softmax and their gradients
-- over rows of `dim` elements, one block per row. dim = 64: every row
-- param is read and written 8 bf16 or 4 f32 at a time; dim = 12: f32 4 at
-- a time, bf16 (12 is not a multiple of 8) scalar; dim = 7: all scalar
-- (30 rows: no multiple of 4 either).
local cfg = config{rows = 30, dim = 64}
local x = input("x", {cfg.rows, cfg.dim}, "f32")
local a = nn.LayerNorm("ln", cfg.dim)(x * 2.0)
local s = param("s", {cfg.dim}, normal(0.5))
local p = nn.softmax(a * s)
local loss = mean(tanh(a) * p) * 100.0 + mean(a * a)
minimize(loss)
train{data = "blobs", batch = cfg.rows, steps = 1, lr = 1e-2}
