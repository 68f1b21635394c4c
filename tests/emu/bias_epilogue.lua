-- bias_epilogue.lua - test_emu_plan's model whose first linear layer has no
-- activation: its fuse group is the matmul and the bias add alone, which the
-- plan gives to the GEMM as a bias epilogue (the sum feeds the next matmul).
local cfg = config{batch = 16, dim = 24, hidden = 40, classes = 8}
sym{B = cfg.batch, D = cfg.dim, K = cfg.classes}

local x = input("x", {cfg.batch, cfg.dim}, "f32")
local y = input("y", {cfg.batch}, "i32")
local fc = nn.Linear("fc", cfg.dim, cfg.hidden, {std = 0.2})
local head = nn.Linear("head", cfg.hidden, cfg.classes, {std = 0.2})
local logits = head(fc(x))
minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = cfg.batch, steps = 10, lr = 1e-2}
