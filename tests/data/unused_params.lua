-- two params the loss never sees: one unused, one feeding only an output
local x = input("x", {4, 3}, "f32")
local w = param("w", {3, 2}, normal(0.1))
local unused = param("unused", {3, 2}, zeros())
local side = param("side", {2}, zeros())
output("o", x:matmul(w) + side)
minimize(x:matmul(w):sum())
