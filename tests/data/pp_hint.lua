-- pp_hint.lua - an MLP on blobs whose pipeline cut is set by pp_stage
-- (tests/cli/pp.sh). cut = k: stage 1 begins with layer k's output
-- (0: no hint, the compiler chooses); stage2 = k: a second hint, stage 2
-- at layer k (to test the errors: out of range, out of order); inner = k:
-- layer k by hand, with a pp_stage(_, 1) between its matmul and its bias
-- (an error: it splits the layer's params over two stages).
local cfg = config{batch = 16, dim = 8, hidden = 32, depth = 6, classes = 4, steps = 20,
                   lr = 1e-3, cut = 1, stage2 = 0, inner = 0}
sym{B = cfg.batch, D = cfg.dim, K = cfg.classes}

local x = input("x", {"B", "D"}, "f32")
local y = input("y", {"B"}, "i32")

local h, width = x, "D"
for i = 1, cfg.depth do
  if i == cfg.inner then
    local w = param("fc" .. i .. ".weight", {width, cfg.hidden}, normal(0.1))
    local b = param("fc" .. i .. ".bias", {cfg.hidden}, zeros())
    h = relu(pp_stage(matmul(h, w), 1) + b)
  else
    local fc = nn.Linear("fc" .. i, width, cfg.hidden, {std = math.sqrt(2 / size(width))})
    h = relu(fc(h))
  end
  width = cfg.hidden
  if i == cfg.cut then
    h = pp_stage(h, 1)
  end
  if i == cfg.stage2 then
    h = pp_stage(h, 2)
  end
end
local head = nn.Linear("head", width, "K", {std = 0.02})
local logits = head(h)
minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = cfg.batch, steps = cfg.steps, lr = cfg.lr, weight_decay = 0.0,
      eval_every = 0, val_fraction = 0}
