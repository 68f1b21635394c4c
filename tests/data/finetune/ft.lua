-- a fine-tuning target: mlp.lua's body under other names, a new head
local cfg = config{classes = 10, hidden = 128, steps = 50, lr = 1e-2}
sym{B = 64, D = 2, K = cfg.classes}
local x = input("x", {"B", "D"}, "f32")
local y = input("y", {"B"}, "i32")
local h = relu(nn.Linear("body.0", "D", cfg.hidden)(x))
h = relu(nn.Linear("body.1", cfg.hidden, cfg.hidden)(h))
local logits = nn.Linear("cls", cfg.hidden, "K", {std = 0.02})(h)
minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = 64, steps = cfg.steps, lr = cfg.lr, min_lr = cfg.lr / 10,
      warmup = 5, weight_decay = 0.0, eval_every = 100}
