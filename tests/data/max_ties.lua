-- max_ties.lua - the gradient of max and min over tied elements (issue 13,
-- item 12). w starts at 1 and appears twice in the reduced vector, so the
-- two elements always tie:
--   min = 0: loss = max(w, w) - 1.5 w = -0.5 w: d(loss)/dw = -0.5, w rises
--   min = 1: loss = 1.5 w - min(w, w) =  0.5 w: d(loss)/dw = +0.5, w falls
-- Giving each tied element the whole incoming gradient (the old rule) made
-- the gradient +0.5 and -0.5: w moved the wrong way. The gradient is split
-- evenly over the tied elements; tests/cli/train_max_ties.sh trains both.
-- The blobs inputs and the "logits" output are there only because the data
-- source needs them.
local cfg = config{min = 0, steps = 10, lr = 0.1}
local x = input("x", {8, 2}, "f32")
local y = input("y", {8}, "i32")
local w = param("w", {1}, ones())
local ww = concat({w, w}, 0)
if cfg.min == 1 then
  minimize(1.5 * w:sum() - ww:min(0))
else
  minimize(ww:max(0) - 1.5 * w:sum())
end
output("logits", x + cast(y, "f32"):reshape({8, 1}))
train{data = "blobs", batch = 8, steps = cfg.steps, lr = cfg.lr, warmup = 0,
      weight_decay = 0.0, eval_every = 0}
