-- tensors_mlp.lua - a small MLP classifier trained on the user's arrays
-- (data = "tensors"; tests/cli/train_tensors.sh writes them).
--
-- Inputs:  x f32[B,D] features, y i32[B] class ids in [0, K).
-- Outputs: loss (mean cross-entropy), logits f32[B,K].
local cfg = config{batch = 16, dim = 4, hidden = 32, classes = 3, steps = 60, lr = 3e-2}

local x = input("x", {cfg.batch, cfg.dim}, "f32")
local y = input("y", {cfg.batch}, "i32")

local fc = nn.Linear("fc", cfg.dim, cfg.hidden, {std = math.sqrt(2 / cfg.dim)})
local head = nn.Linear("head", cfg.hidden, cfg.classes, {std = 0.02})
local logits = head(relu(fc(x)))

minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "tensors", batch = cfg.batch, steps = cfg.steps, lr = cfg.lr, warmup = 0,
      eval_every = 20, eval_batches = 4}
