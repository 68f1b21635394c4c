-- embedding lookup with float indices
local idx = input("idx", {4, 8}, "f32")
local wte = param("wte", {16, 32}, normal(0.02))
local e = nn.embedding(wte, idx) -- ERROR
minimize(e:sum())
