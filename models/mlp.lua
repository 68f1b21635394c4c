-- mlp.lua - a small MLP classifier on synthetic Gaussian blobs (data = "blobs").
--
-- Config keys (change with --set key=value):
--   batch    64    examples per step (B)
--   dim      2     input features (D)
--   hidden   128   hidden units per layer
--   depth    2     hidden layers (ReLU)
--   classes  4     classes (K)
--   steps, lr     training length and peak learning rate
--
-- Inputs:  x f32[B,D] features, y i32[B] class ids in [0, K).
-- Outputs: loss (mean cross-entropy), logits f32[B,K].
local cfg = config{batch = 64, dim = 2, hidden = 128, depth = 2, classes = 4,
                   steps = 500, lr = 1e-2}
sym{B = cfg.batch, D = cfg.dim, K = cfg.classes}

local x = input("x", {"B", "D"}, "f32")
local y = input("y", {"B"}, "i32")

local h, width = x, "D"
for i = 1, cfg.depth do
  local fc = nn.Linear("fc" .. i, width, cfg.hidden, {std = math.sqrt(2 / size(width))})
  h = relu(fc(h))
  width = cfg.hidden
end
local head = nn.Linear("head", width, "K", {std = 0.02})
local logits = head(h)

minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = cfg.batch, steps = cfg.steps, lr = cfg.lr, min_lr = cfg.lr / 10,
      warmup = 20, weight_decay = 0.0, eval_every = 100}
