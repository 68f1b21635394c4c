-- causal attention with fewer queries than keys
local q = input("q", {2, 4, 8}, "f32")
local k = input("k", {2, 5, 8}, "f32")
local w = param("w", {8, 8}, normal(0.1))
minimize(nn.attention(q:matmul(w), k, k):sum())
