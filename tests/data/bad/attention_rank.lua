-- nn.attention given a rank-1 tensor: checked at the caller's line
local q = input("q", {8}, "f32")
local y = nn.attention(q, q, q)
minimize(y:sum())
