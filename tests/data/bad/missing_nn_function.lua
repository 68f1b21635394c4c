-- nn.softmx: a misspelt nn function
local x = input("x", {4, 8}, "f32")
local w = param("w", {8, 8}, normal(0.1))
minimize(nn.softmx(x:matmul(w)):sum())
