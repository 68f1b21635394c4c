-- early_stop.lua - train{early_stop, keep_best} on blobs (tests/cli/train_early_stop.sh):
-- a small MLP that stops improving on the held-out loss within a few hundred steps.
-- Outputs: loss, xent (the same cross-entropy, as an extra scalar output), logits.
local cfg = config{steps = 2000}
sym{B = 64, D = 2, K = 4}
local x = input("x", {"B", "D"}, "f32")
local y = input("y", {"B"}, "i32")
local h = relu(nn.Linear("fc1", "D", 64)(x))
local logits = nn.Linear("head", 64, "K", {std = 0.02})(h)
local loss = nn.cross_entropy(logits, y)
minimize(loss)
output("logits", logits)
output("xent", loss)
train{data = "blobs", batch = 64, steps = cfg.steps, lr = 1e-2, warmup = 5, eval_every = 20,
      early_stop = {metric = "val_loss", patience = 2, min_delta = 1e-3}, keep_best = true}
