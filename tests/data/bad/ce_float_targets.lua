-- float targets to nn.cross_entropy are an error at the caller's line
local x = input("x", {4, 8})
local y = input("y", {4}, "f32")
local fc = nn.Linear("fc", 8, 3)
minimize(nn.cross_entropy(fc(x), y)) -- ERROR
