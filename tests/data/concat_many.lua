-- concat_many.lua - concat of more than 64 tensors: a tanh RNN unrolled over
-- T = 100 steps whose hidden states are concatenated into one [B, T*H]
-- feature row (the lowering once stopped at 64 operands). Used by
-- test_backend_cpu and test_emu_plan against the interpreter / CPU backend.
local B, H, T = 2, 3, 100
local x = input("x", {B, H})
local y = input("y", {B}, "i32")
local u = param("u", {H, H}, normal(0.5))
local head = param("head", {T * H, 4}, normal(0.1))
local h, hs = x, {}
for t = 1, T do
  h = tanh(h:matmul(u))
  hs[t] = h
end
local all = concat(hs, 1)
local logits = all:matmul(head)
minimize(nn.cross_entropy(logits, y))
output("logits", logits)
output("all", all)
train{data = "blobs", batch = B, steps = 2, lr = 1e-2}
