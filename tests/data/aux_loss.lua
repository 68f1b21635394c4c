-- A classifier whose loss is a sum of two terms, each an extra scalar
-- output: kiln shows them on the step, eval and final lines.
local x = input("x", {32, 2}, "f32")
local y = input("y", {32}, "i32")
local fc = nn.Linear("fc", 2, 16)
local head = nn.Linear("head", 16, 4)
local logits = head(relu(fc(x)))
local xent = nn.cross_entropy(logits, y)
local zloss = (logits * logits):mean() * 1e-3
output("xent", xent)
output("zloss", zloss)
output("logits", logits)
minimize(xent + zloss)
train{data = "blobs", batch = 32, steps = 40, lr = 1e-2, eval_every = 20, eval_batches = 2}
