-- merged_grads.lua - mlp.lua with two extra biases added after the head's
-- own: logits = head(h) + b1 + b2. The three biases have the same gradient,
-- so simplify computes it once and the outputs grad.b1 and grad.b2 name one
-- tensor; the optimizer's NaN guard then multiplies the smallest param's
-- gradient (one of the three) by (loss*0 + 1), a gradient computed from
-- another param's. The comm pass must accumulate and all-reduce each
-- gradient once, from local values (test_zero test_merged_grads: 2 ranks,
-- grad_accum 2 and zero=1 against 1 rank). Data: blobs, as mlp.lua.
local cfg = config{batch = 64, dim = 2, hidden = 32, classes = 4, steps = 100, lr = 1e-2}
sym{B = cfg.batch, D = cfg.dim, K = cfg.classes}

local x = input("x", {"B", "D"}, "f32")
local y = input("y", {"B"}, "i32")
local fc = nn.Linear("fc", "D", cfg.hidden, {std = math.sqrt(2 / size("D"))})
local head = nn.Linear("head", cfg.hidden, "K", {std = 0.02})
local b1 = param("b1", {"K"}, zeros())
local b2 = param("b2", {"K"}, zeros())
local logits = head(relu(fc(x))) + b1 + b2

minimize(nn.cross_entropy(logits, y))
output("logits", logits)
train{data = "blobs", batch = cfg.batch, steps = cfg.steps, lr = cfg.lr, min_lr = cfg.lr / 10,
      warmup = 0, weight_decay = 0.0}
